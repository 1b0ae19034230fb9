"""Workflows for tests of the workers that run workflows: one without activities, one with a local activity."""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError


@workflow.defn(name="TestEcho")
class EchoWorkflow:
    @workflow.run
    async def run(self, text: str) -> str:
        return text.upper()


ECHO_LOCAL = "test.echo_local"


@workflow.defn(name="TestLocalEcho")
class LocalEchoWorkflow:
    """Runs its text through the local activity `ECHO_LOCAL`; a failure comes back as text."""

    @workflow.run
    async def run(self, text: str) -> str:
        try:
            return await workflow.execute_local_activity(
                ECHO_LOCAL, text, result_type=str, start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=1))
        except (ActivityError, ApplicationError) as err:
            # A local activity's own failure arrives unwrapped, as the ApplicationError it raised.
            return f"failed: {err.cause if isinstance(err, ActivityError) else err.message}"
