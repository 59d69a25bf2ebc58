"""Reading 22.05's `squeue --json` (a real capture, tests/data/slurm/SOURCES.md) and the outage it hides."""

import json
import subprocess
from pathlib import Path

import pytest

from gpufinops.places.slurm.commands import SlurmCommands, SlurmUnavailable
from gpufinops.places.slurm.jobs import GpuSlot, expand_hostlist, gpu_jobs, parse_job, parse_squeue

CAPTURE = Path(__file__).resolve().parents[2] / "data" / "slurm" / "squeue-22.05.json"


def test_a_real_capture_reads_every_job_with_its_gpu_indexes():
    jobs, problems = parse_squeue("cap", json.loads(CAPTURE.read_text()))
    assert problems == []
    by_id = {j.display_id: j for j in jobs}
    assert set(by_id) == {"1", "2_0", "2_1", "3"}
    assert by_id["1"].gpus == (GpuSlot("vm", 0), GpuSlot("vm", 1)) and by_id["1"].user == "alice"
    # An array task is known by its array id and task; commands take its own job number.
    assert by_id["2_0"].job_id == "4" and by_id["2_0"].gpus == (GpuSlot("vm", 2),)
    assert by_id["3"].batch is False and by_id["3"].state == "PENDING"
    assert [j.subject_id for j in gpu_jobs(jobs)] == ["slurm:cap/1", "slurm:cap/2_0", "slurm:cap/2_1"]


@pytest.mark.parametrize("detail, nodes, want, unread", [
    (["gpu:a100:1(IDX:3)", "gpu:a100:2(IDX:0,2)"], "n[1-2]", [("n1", 3), ("n2", 0), ("n2", 2)], False),
    (["gpu:2(IDX:0-1),mps:100(0/100,0/100)"], "n1", [("n1", 0), ("n1", 1)], False),
    (["gpu:a100:1(IDX:N/A)"], "n1", [], True),
    (["gpu:a100:2(IDX:0)"], "n1", [], True),  # a count the index list disagrees with
    ([], "n1", [], True),
])
def test_gpu_indexes_per_node_and_what_cannot_be_read(detail, nodes, want, unread):
    job = parse_job("c", {"job_id": 7, "job_state": "RUNNING", "nodes": nodes, "gres_detail": detail,
                          "tres_per_node": "gres:gpu:1", "start_time": 1796600000})
    assert [(g.node, g.index) for g in job.gpus] == want
    assert bool(job.gpus_unread) is unread


def test_host_lists_expand_as_slurm_writes_them():
    assert expand_hostlist("gpu[01-03,07],login1") == ("gpu01", "gpu02", "gpu03", "gpu07", "login1")
    with pytest.raises(ValueError):
        expand_hostlist("gpu[a-b]")


def _answering(stdout: str, rc: int = 0):
    return lambda argv, env, timeout: subprocess.CompletedProcess(argv, rc, stdout, "")


def test_squeue_with_the_controller_down_is_an_outage_not_an_empty_cluster():
    # What 22.05's squeue --json printed, exit 0, with slurmctld stopped (tests/slurm.py stop_controller).
    down = json.dumps({"meta": {}, "errors": [{"description": "Failed while looking for jobs", "error_number": -1,
                                                "error": "Unspecified error", "source": "slurm_load_jobs"}],
                       "jobs": []})
    with pytest.raises(SlurmUnavailable, match="slurm_load_jobs Failed while looking for jobs"):
        SlurmCommands("c", runner=_answering(down)).squeue()
    with pytest.raises(SlurmUnavailable, match="did not answer JSON"):
        SlurmCommands("c", runner=_answering("<html>")).squeue()


def test_squeue_against_a_stopped_controller_on_a_real_cluster(tmp_path):
    from tests.slurm import SlurmCluster
    cluster = SlurmCluster(tmp_path / "c", name="down").start()
    try:
        commands = SlurmCommands(cluster.name, conf=str(cluster.conf), timeout_s=60)
        assert commands.squeue()["jobs"] == []
        cluster.stop_controller()
        with pytest.raises(SlurmUnavailable):
            commands.squeue()
    finally:
        cluster.stop()
