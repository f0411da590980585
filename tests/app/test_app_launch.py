"""``mdc app`` as a user starts it, in a fresh folder (no trained run): it opens on the shipped model, captions a
scene through the public API, logs no deprecation warning per request, a second app on the same port gets a
one-line error, the console points to ``mdc app --share`` (not gradio's ``share=True``), and after SIGTERM no
``mdc-app-*`` folder (nor gradio's copies of the downloads) is left in the temporary folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from mdc_core.config import SamplerConfig
from mdc_workbench.export.shipped import SHIPPED_LABEL
from tests.train_helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = [getattr(SamplerConfig(length=10), f) for f in ("length", "tokens_per_step", "temperature", "top_k",
                                                             "threshold", "remask_threshold", "remask_steps", "seed")]


def _wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 240.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stderr.read()
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(url)


def test_mdc_app_in_a_fresh_folder_captions_with_the_shipped_model_and_cleans_up(tmp_path: Path) -> None:
    from gradio_client import Client
    from mdc_app.callbacks import SAMPLER_FIELDS

    assert list(SAMPLER_FIELDS) == ["length", "tokens_per_step", "temperature", "top_k", "threshold",
                                    "remask_threshold", "remask_steps", "seed"]
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("GRADIO_TEMP_DIR", None)
    port = free_port()
    cmd = [sys.executable, "-m", "mdc_workbench", "app", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_up(url, proc)
        info = json.loads(urllib.request.urlopen(url + "gradio_api/info").read())
        assert "/False" not in info["named_endpoints"] and "/caption" in info["named_endpoints"]
        client = Client(url, verbose=False, download_files=False)
        client.predict(3, SHIPPED_LABEL, api_name="/show_scene")
        chips, _, _, summary, _ = client.predict(SHIPPED_LABEL, *SETTINGS, api_name="/caption")
        assert 'data-state="revealed"' in chips and SHIPPED_LABEL in summary
        for _ in range(3):  # a few more requests: a warning per request would show up three times
            client.predict(2, api_name="/step")
        client.predict(api_name="/save_json")
        client.predict("last", "mean", api_name="/gif")
        second = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        assert second.stderr.strip().splitlines() == [
            f"mdc: error: port {port} on 127.0.0.1 is in use (another app or server runs there); stop it or pass "
            "--port with a free port"]
        assert list(temp.glob("mdc-app-*"))  # the downloads were written ...
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGTERM), err[-3000:]
    assert f"* Running on local URL:  http://127.0.0.1:{port}/" in out, out
    assert "`mdc app --share`" in out and "share=True" not in out + err  # the CLI's flag, not gradio's launch()
    assert "DeprecationWarning" not in err and "Traceback" not in err, err[-3000:]
    assert not list(temp.glob("mdc-app-*"))  # ... and removed when the app stopped
    left = [p for p in temp.rglob("*") if p.is_file()]
    assert not left, left
