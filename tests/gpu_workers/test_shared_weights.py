"""The trainer puts a version's weights into the object store once for all the engines a restore loads."""

import asyncio

from turnkeep.gpu_workers.shared_weights import SharedWeights


def blob(value: bytes):
    async def make() -> bytes:
        return value
    return make


def test_one_put_per_version_for_every_engine_then_a_new_one():
    asyncio.run(_one_put_per_version())


async def _one_put_per_version():
    puts: list[bytes] = []
    now = [0.0]
    shared = SharedWeights(lambda blob: puts.append(blob) or f"ref{len(puts)}", keep_s=120, clock=lambda: now[0])
    refs = [await shared.ref(7, blob(b"w7")) for _ in range(4)]  # four engines load version 7
    assert refs == ["ref1"] * 4 and puts == [b"w7"]
    assert await shared.ref(8, blob(b"w8")) == "ref2"  # a new version is put again
    shared.forget()  # a checkpoint was loaded: same version number, other weights
    assert await shared.ref(8, blob(b"w8'")) == "ref3"
    now[0] = 121.0  # not kept past keep_s: the store does not hold a large model's copy between restores
    assert await shared.ref(8, blob(b"w8")) == "ref4" and len(puts) == 4
