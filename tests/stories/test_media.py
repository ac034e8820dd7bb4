"""Videos and images: kept in the run folder, a ``media`` record in ``metrics.jsonl``, written to TensorBoard and W&B,
sent to a real ``otel-rl serve`` and played on its run page in headless Chromium."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import imageio.v3 as iio
import imageio_ffmpeg
import numpy as np
import pytest
import urllib.request

import otel_rl
from otel_rl.outputs.motrix.backfill import backfill
from otel_rl.outputs.wandb import STEP_METRIC
from otel_rl.readers.server import IngestServer
import wandb_reader
from browser import Browser

FRAMES = 24
FPS = 12


def _frames() -> list[np.ndarray]:
    """A square moving across a 47x33 frame (odd sizes: the encoder pads them), as a gym env's render gives them."""
    out = []
    for t in range(FRAMES):
        frame = np.zeros((33, 47, 3), np.uint8)
        frame[10:20, t : t + 10] = (250, 40, 40)
        out.append(frame)
    return out


def _loop(run_dir: Path, clip: Path, **options) -> otel_rl.Telemetry:
    tel = otel_rl.init(run_dir=run_dir, run_id=run_dir.name, panel=False, quiet=True, system_metrics_interval_s=0, **options)
    with tel.run():
        for i in range(5):
            with tel.iteration(i, env_steps=(i + 1) * 100):
                with tel.phase("learning"):
                    pass
            tel.scalars({"Loss/critic": float(i)})
        tel.video("Media/play", _frames(), fps=FPS, caption="the trained policy")
        tel.image("Media/heatmap", np.linspace(0, 1, 20 * 30).reshape(20, 30))  # floats from 0 to 1, one channel
        tel.video("Media/clip", clip, step=700)  # a file the loop already has: copied as it is
    tel.close()
    return tel


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("clip") / "clip.gif"
    iio.imwrite(path, np.stack(_frames()), extension=".gif", duration=80, loop=0)
    return path


def test_a_video_and_an_image_reach_the_folder_the_records_tensorboard_and_wandb(tmp_path, clip, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "media-run"
    tel = _loop(run_dir, clip, tensorboard=True, wandb=True, wandb_mode="offline")
    assert tel.stats()["dropped"]["media"] == 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    found = {r["key"]: r for r in records if r["kind"] == "media"}
    assert set(found) == {"Media/play", "Media/heatmap", "Media/clip"}
    play = found["Media/play"]
    assert (play["type"], play["format"], play["frames"], play["fps"], play["width"], play["height"], play["step"], play["caption"]) == \
        ("video", "mp4", FRAMES, FPS, 47, 33, 500, "the trained policy")  # fmt: skip
    # The MP4 decodes to the frames given (a lossy codec: close, not equal), at its pace.
    reader = imageio_ffmpeg.read_frames(str(run_dir / play["path"]))
    meta = next(reader)
    decoded = [np.frombuffer(f, np.uint8).reshape(34, 48, 3) for f in reader]  # padded to even sizes
    assert meta["fps"] == FPS and len(decoded) == FRAMES
    assert abs(int(decoded[5][15, 10, 0]) - 250) < 40 and decoded[5][15, 40, 0] < 40  # the square, where it was
    heatmap = iio.imread(run_dir / found["Media/heatmap"]["path"])
    assert heatmap.shape == (20, 30) and heatmap[0, 0] == 0 and heatmap[-1, -1] == 255
    assert (run_dir / found["Media/clip"]["path"]).read_bytes() == clip.read_bytes() and found["Media/clip"]["step"] == 700
    # TensorBoard's Images tab: the image as written, the video as an animated GIF of its frames.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"images": 0})
    board.Reload()
    assert set(board.Tags()["images"]) == {"Media/play", "Media/heatmap", "Media/clip"}
    gif = board.Images("Media/play")[0]
    assert gif.step == 500 and gif.encoded_image_string[:6] == b"GIF89a"
    assert iio.imread(gif.encoded_image_string, index=None).shape[0] == FRAMES
    assert board.Images("Media/heatmap")[0].encoded_image_string == (run_dir / found["Media/heatmap"]["path"]).read_bytes()
    # W&B: a video and an image in the run, as W&B's own reader reads it.
    (wandb_run,) = wandb_reader.run_dirs(run_dir)
    history = wandb_reader.history(wandb_run)
    play_row = next(row for row in history if "Media/play._type" in row)
    assert play_row["Media/play._type"] == "video-file" and play_row[STEP_METRIC] == 500 and play_row["Media/play.caption"] == "the trained policy"
    assert any(row.get("Media/heatmap._type") == "image-file" for row in history)
    assert list((wandb_run / "files" / "media" / "videos").rglob("*.mp4")) and list((wandb_run / "files" / "media" / "images").rglob("*.png"))


def test_the_run_page_plays_the_video_and_shows_the_image(tmp_path, clip):
    run_dir = tmp_path / "played"
    with IngestServer(str(tmp_path / "media.sqlite3"), token="s3cret") as server:
        _loop(run_dir, clip, motrix_url=server.url, motrix_token="s3cret")
        listed = _get(server.url + "/api/v1/runs/played/media", "s3cret")
        deadline = time.monotonic() + 60
        while not all(m["uploaded"] for m in listed["media"]) and time.monotonic() < deadline:  # sent beside the records
            time.sleep(0.2)
            listed = _get(server.url + "/api/v1/runs/played/media", "s3cret")
        assert [m["uploaded"] for m in listed["media"]] == [True, True, True], listed
        browser = Browser(height=2400)
        try:
            browser.goto(f"{server.url}/runs/played#token=s3cret")
            browser.wait_for("document.querySelector('video[data-key=\"Media/play\"]') !== null")
            # It plays: decoded by the browser (ready, its size, its length), and a second of playback moves it on.
            browser.wait_for("document.querySelector('video[data-key=\"Media/play\"]').readyState >= 2")
            size = browser.eval("(() => { const v = document.querySelector('video[data-key=\"Media/play\"]'); return [v.videoWidth, v.videoHeight, v.duration]; })()")
            assert size[:2] == [48, 34] and abs(size[2] - FRAMES / FPS) < 0.2, size
            played = browser.eval("document.querySelector('video[data-key=\"Media/play\"]').play().then(() => 'playing', (e) => String(e))")
            assert played == "playing"
            browser.wait_for("document.querySelector('video[data-key=\"Media/play\"]').currentTime > 0.3")
            image = browser.wait_for("(() => { const i = document.querySelector('img[data-key=\"Media/heatmap\"]'); return i && i.complete && i.naturalWidth ? [i.naturalWidth, i.naturalHeight] : null; })()")
            assert image == [30, 20]
            gif = browser.wait_for("(() => { const i = document.querySelector('img[data-key=\"Media/clip\"]'); return i && i.complete && i.naturalWidth; })()")
            assert gif == 47
            assert "Media (3)" in browser.eval("document.getElementById('media-section').textContent")
            browser.screenshot(tmp_path / "media.png")
        finally:
            browser.close()


def test_the_backfill_sends_the_files_the_live_stream_could_not(tmp_path, clip):
    run_dir = tmp_path / "later"
    _loop(run_dir, clip)  # no service while it ran
    with IngestServer(str(tmp_path / "later.sqlite3")) as server:
        totals = backfill(run_dir, server.url)
        assert (totals["rejected"], totals["media_sent"], totals["media_failed"]) == (0, 3, 0)
        listed = _get(server.url + "/api/v1/runs/later/media")
        assert [m["uploaded"] for m in listed["media"]] == [True, True, True]
        name = listed["media"][0]["path"].split("/")[1]
        with urllib.request.urlopen(f"{server.url}/api/v1/runs/later/media/{name}") as answer:
            assert answer.headers["Content-Type"] == "video/mp4" and answer.read() == (run_dir / "media" / name).read_bytes()


def test_the_server_takes_only_media_files_within_its_bounds_and_with_the_token(tmp_path, clip):
    run_dir = tmp_path / "bounded"
    _loop(run_dir, clip)
    with IngestServer(str(tmp_path / "b.sqlite3"), token="t", max_media_bytes=4096) as server:
        backfill(run_dir, server.url, token="t")
        url = server.url + "/api/v1/runs/bounded/media/"
        assert _put(url + "x.mp4", b"\x89PNG\r\n\x1a\n", "t")[0] == 400  # a PNG's bytes named .mp4
        assert _put(url + "x.exe", b"MZ", "t")[0] == 400
        assert _put(url + "..%2Fx.png", b"\x89PNG\r\n\x1a\n", "t")[0] == 400
        assert _put(url + "big.png", b"\x89PNG\r\n\x1a\n" + bytes(5000), "t")[0] == 413
        assert _put(url + "x.png", b"\x89PNG\r\n\x1a\n", None)[0] == 401
        assert _put(server.url + "/api/v1/runs/nobody/media/x.png", b"\x89PNG\r\n\x1a\n", "t")[0] == 404
        assert _put(url + "ok.png", b"\x89PNG\r\n\x1a\n", "t")[0] == 200


def test_bad_media_input_is_one_warning_each_and_costs_nothing_else(tmp_path, caplog):
    run_dir = tmp_path / "bad"
    tel = otel_rl.init(run_dir=run_dir, panel=False, quiet=True, system_metrics_interval_s=0)
    calls = [
        lambda: tel.video("Media/x", np.zeros((5,))),  # not frames
        lambda: tel.video("Media/x", np.zeros((4, 8, 8, 7))),  # 7 channels
        lambda: tel.video("Media/x", tmp_path / "missing.mp4"),
        lambda: tel.video("Media/x", str(run_dir)),  # a folder, named like no video
        lambda: tel.image("Media/x", tmp_path / "a.txt"),
        lambda: tel.video("Media/x", _frames(), fps=0),
        lambda: tel.video(42, _frames()),
        lambda: tel.video("Media/x", object()),
        lambda: tel.video("Media/x", _frames(), step=-1),
        lambda: tel.video("Media/x", []),
    ]
    with caplog.at_level(logging.WARNING, logger="otel_rl"), tel.run():
        for i in range(3):
            with tel.iteration(i, env_steps=i):
                pass
        for call in calls:
            call()
        tel.video("Media/ok", np.stack(_frames()).astype(np.float32) / 255, fps=FPS)  # floats, channels last
        tel.image("Media/nan", np.full((4, 4, 3), np.nan))
        tel.scalars({"Loss/critic": 1.0})
    tel.close()
    said = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(said) == len(calls), said
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sorted(r["key"] for r in records if r["kind"] == "media") == ["Media/nan", "Media/ok"]
    assert [r["values"] for r in records if r["kind"] == "scalars" and "Loss/critic" in r["values"]] == [{"Loss/critic": 1.0}]
    assert records[-1]["kind"] == "run" and records[-1]["status"] == "finished"


def _get(url: str, token: str | None = None) -> dict:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _put(url: str, body: bytes, token: str | None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, method="PUT", headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
