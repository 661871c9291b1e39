"""`sweep launch --detach` submission: a freshly started cluster whose head has no job agent yet."""

import json

import pytest
import ray.job_submission

from scalelab.sweeps.execution import ray_cluster


class FlakyClient:
    """Answers like a head whose job agent is not up for the first `misses` submissions."""

    calls = 0

    def __init__(self, address, misses=2, error="No available agent to submit job, please try again later."):
        self.misses, self.error = misses, error

    def submit_job(self, **kwargs):
        FlakyClient.calls += 1
        if FlakyClient.calls <= self.misses:
            raise RuntimeError(f"Request failed with status code 500: {self.error}")
        return "raysubmit_test"


@pytest.fixture
def no_sleep(monkeypatch):
    FlakyClient.calls = 0
    monkeypatch.setattr(ray_cluster.time, "sleep", lambda s: None)


def test_submission_waits_for_the_heads_job_agent(tmp_path, monkeypatch, no_sleep):
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", FlakyClient)
    job_id = ray_cluster.submit_driver("http://127.0.0.1:8265", tmp_path, ["sweep", "launch", "s.yaml"])
    assert job_id == "raysubmit_test" and FlakyClient.calls == 3
    assert json.loads((tmp_path / ray_cluster.DRIVER_FILE).read_text())["job_id"] == job_id


def test_other_submission_errors_are_not_retried(tmp_path, monkeypatch, no_sleep):
    def client(address):
        return FlakyClient(address, misses=5, error="runtime_env: bad pip spec")

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", client)
    with pytest.raises(RuntimeError, match="bad pip spec"):
        ray_cluster.submit_driver("http://127.0.0.1:8265", tmp_path, ["sweep", "launch", "s.yaml"])
    assert FlakyClient.calls == 1 and not (tmp_path / ray_cluster.DRIVER_FILE).exists()
