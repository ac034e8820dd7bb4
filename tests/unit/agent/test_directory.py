"""The agents' directory read while agents come and go: a directory that vanishes mid-listing holds no segment."""

from __future__ import annotations

import os
import threading

from otel_rl.agent import directory


def test_segments_are_listed_while_agents_remove_their_directories(tmp_path):
    """Agents end (and remove their directories) at any moment; listing the others never raises for it."""
    for n in range(3):
        (tmp_path / f"agent-{n}").mkdir()
        (tmp_path / f"agent-{n}" / f"run-{n}-a.seg").write_bytes(b"")
    (tmp_path / "not-a-folder").write_bytes(b"")
    assert sorted(p.name for p in directory.segments(tmp_path, below=True)) == ["run-0-a.seg", "run-1-a.seg", "run-2-a.seg"]
    assert directory.segments(tmp_path / "gone", below=True) == [] and directory.segments(tmp_path / "gone") == []
    stop = threading.Event()

    def churn() -> None:  # an agent directory made and removed again and again, as agents start and end
        while not stop.is_set():
            folder = tmp_path / "agent-churn"
            try:
                folder.mkdir()
                (folder / "run-9-a.seg").write_bytes(b"")
                (folder / "run-9-a.seg").unlink()
                folder.rmdir()
            except OSError:
                pass

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        for _ in range(2000):
            found = {p.name for p in directory.segments(tmp_path, "run-*.seg", below=True)}
            assert {"run-0-a.seg", "run-1-a.seg", "run-2-a.seg"} <= found
    finally:
        stop.set()
        thread.join()
    assert os.path.exists(tmp_path / "agent-0")
