"""A workflow with no activities, for tests of the workers that run workflows."""

from temporalio import workflow


@workflow.defn(name="TestEcho")
class EchoWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        return text.upper()
