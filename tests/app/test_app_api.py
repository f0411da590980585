"""The app's API as a script sees it: the shipped model served on a free loopback port (analytics and telemetry
off), called through ``gradio_client`` with named parameters; docs/app.md's example is run as written."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # before gradio is imported (app/__init__.py sets them too)
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

from mdc_core.config import SamplerConfig  # noqa: E402
from mdc_workbench.export.shipped import SHIPPED_DIR, SHIPPED_LABEL  # noqa: E402
from tests.train_helpers import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DOCS_URL = "http://127.0.0.1:7860/"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The app on the shipped model, on 127.0.0.1 and a free port; a client of it."""
    from gradio_client import Client
    from mdc_app.launch import serve
    port = free_port()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        demo = serve(SHIPPED_DIR, root=None, port=port, block=False)
    url = f"http://127.0.0.1:{port}/"
    try:
        yield {"url": url, "client": Client(url, verbose=False, download_files=False), "console": out.getvalue(),
               "tmp": tmp_path_factory.mktemp("api")}
    finally:
        demo.close()


def _docs_example() -> str:
    """The first python block after docs/app.md's "Calling the app from a script" heading."""
    text = (ROOT / "docs" / "app.md").read_text()
    section = text.split("## Calling the app from a script", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _check_trajectory(result: dict, length: int) -> None:
    """A greedy (k = 1) trajectory: one reveal per step, each position once, canvases that fill up to the caption."""
    steps = result["steps"]
    assert len(steps) == length == len(result["tokens"])
    assert result["caption"] == steps[-1]["text"] and steps[-1]["canvas"] == result["tokens"]
    positions = [r["position"] for s in steps for r in s["revealed"]]
    assert sorted(positions) == list(range(length))
    for i, step in enumerate(steps):
        assert step["step"] == i and len(step["revealed"]) == 1 and step["remasked"] == []
        assert all(0.0 <= r["confidence"] <= 1.0 for r in step["revealed"])
        assert step["canvas"].count("[MASK]") == length - i - 1
        for r in step["revealed"]:
            assert step["canvas"][r["position"]] == result["tokens"][r["position"]] == r["token"]


def test_docs_example_runs_against_the_live_app(served):
    code = _docs_example()
    assert DOCS_URL in code and 'api_name="/caption_json"' in code
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code.replace(DOCS_URL, served["url"]), "docs/app.md", "exec"), namespace)  # noqa: S102
    result = namespace["result"]
    assert result["run"] == SHIPPED_LABEL and result["source"] == "scene 3"
    assert result["settings"]["length"] == 10 and result["settings"]["temperature"] == 0.0
    _check_trajectory(result, 10)
    lines = [line for line in printed.getvalue().splitlines() if not line.startswith("Loaded as API")]  # the client's
    print("\n".join(lines))  # what docs/app.md shows
    assert lines[0] == result["caption"] and len(lines) == 1 + 10
    assert lines[-1].endswith("-> " + result["caption"])


def test_named_parameters_an_uploaded_image_and_the_pages_endpoints(served):
    from gradio_client import handle_file
    client = served["client"]
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    fields = list(SamplerConfig.__dataclass_fields__)
    params = [p["parameter_name"] for p in api["/caption_json"]["parameters"]]
    assert params == ["run", "length", "tokens_per_step", "temperature", "top_k", "threshold", "remask_threshold",
                      "remask_steps", "seed", "image", "scene", "prompt"]
    assert set(params[1:9]) <= set(fields)
    assert not [p for e in api.values() for p in e["parameters"] if p["parameter_name"].startswith("param_")]
    assert not [r for e in api.values() for r in e["returns"] if r["label"].startswith("value_")]

    scene = client.predict(scene=3, length=8, api_name="/caption_json")
    image_path = served["tmp"] / "scene3.png"
    from mdc_app.callbacks import show_scene
    show_scene(3, SHIPPED_LABEL, None)[0]["image"].save(image_path)
    uploaded = client.predict(image=handle_file(str(image_path)), length=8, api_name="/caption_json")
    assert uploaded["source"] == "image" and uploaded["caption"] == scene["caption"]  # the same pixels
    _check_trajectory(uploaded, 8)
    fixed = client.predict(scene=3, prompt="a drawing of a _ square", api_name="/caption_json")
    assert fixed["fixed"] == [0, 1, 2, 3, 5] and fixed["steps"][0]["canvas"][:4] == ["a", "drawing", "of", "a"]
    with pytest.raises(Exception, match="give an image or a scene number"):
        client.predict(length=8, api_name="/caption_json")
    with pytest.raises(Exception, match="greater than maximum value 2.0"):  # gradio checks the slider range
        client.predict(scene=3, temperature=5.0, api_name="/caption_json")

    client.predict(scene=3, run=SHIPPED_LABEL, api_name="/show_scene")  # the page's endpoints, in this session
    chips, step, _, summary, data = client.predict(run=SHIPPED_LABEL, length=8, api_name="/caption")
    assert 'data-step="8"' in chips and step["maximum"] == 8 and scene["caption"] in summary
    assert {k: v for k, v in data.items() if k != "latency_s"} == {  # /caption's data as JSON: /caption_json's
        k: v for k, v in scene.items() if k != "latency_s"}
    table, scores = client.predict(run=SHIPPED_LABEL, captions=f"{scene['caption']}\na blue circle",
                                   api_name="/score")
    assert [r["caption"] for r in scores["captions"]] == [scene["caption"], "a blue circle"] and "<table" in table
    assert scores["captions"][0]["scores"]["heuristic"]["score"] > scores["captions"][1]["scores"]["heuristic"]["score"]


def test_console_points_to_the_clis_share_flag(served):
    console = served["console"]
    assert f"* Running on local URL:  {served['url']}" in console and f"{served['url']}?view=api" in console
    assert "`mdc app --share`" in console and "share=True" not in console


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _bomb_png(width: int, height: int) -> bytes:
    """A 1x1 PNG whose header claims `width` x `height` (CRC fixed): a decompression bomb's header, 70 bytes."""
    data = bytearray(_png(Image.new("L", (1, 1))))
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data)


def test_every_image_entry_point_opens_images_as_the_upload_box(served, capfd):
    """Issue 49 item 4 / 54 item 9: /caption_json (gradio's own decoding) captioned a 12000 px image the upload box
    refuses, saturated 16-bit images, answered a non-image or a path string with gradio's generic error, and the
    server printed a traceback for each; /replay's embedded image skipped the checks too."""
    from gradio_client import handle_file
    from mdc_app.callbacks import SAMPLER_FIELDS, run_caption, show_scene
    from mdc_app.explore import save_json
    from mdc_app.runs import get_run

    from mdc_workbench.viz.animation import record_image
    client, tmp = served["client"], served["tmp"]
    capfd.readouterr()
    files = {"empty.png": b"", "notes.png": b"not an image", "wide.png": _png(Image.new("RGB", (12000, 8))),
             "bomb.png": _bomb_png(20000, 20000)}
    for name, data in files.items():  # the same one-line error from the upload box's endpoint and the API's
        (tmp / name).write_bytes(data)
        errors = []
        for call in ({"image": handle_file(str(tmp / name)), "api_name": "/upload"},
                     {"image": handle_file(str(tmp / name)), "length": 4, "api_name": "/caption_json"}):
            with pytest.raises(Exception) as err:  # noqa: PT011 - gradio_client's AppError carries the message
                client.predict(**call)
            errors.append(str(err.value))
        assert errors[0] == errors[1] and errors[0].startswith(name) and "\n" not in errors[0], errors
    assert "too large" in errors[0]  # the bomb: refused from its header, before decoding
    for payload in ("/etc/passwd", 5, {"path": "https://example.com/x.png", "meta": {"_type": "gradio.FileData"}}):
        for endpoint, message in (("/caption_json", "image: "), ("/upload", "or upload an image")):
            with pytest.raises(Exception, match="uploaded file") as err:  # noqa: PT011
                client.predict(image=payload, api_name=endpoint)
            assert str(err.value).startswith(message), str(err.value)

    # a 16-bit image is scaled to 8 bits (65535 -> 255), not saturated: it is unmasked as its 8-bit twin
    gray = show_scene(3, SHIPPED_LABEL, None)[0]["image"].convert("L")
    deep = Image.fromarray(np.asarray(gray).astype(np.uint16) * 257)
    assert deep.mode == "I;16"
    for name, image in (("gray.png", gray), ("deep.png", deep), ("saturated.png", deep.convert("RGB"))):
        image.save(tmp / name)
    steps = {name: client.predict(image=handle_file(str(tmp / name)), length=8, api_name="/caption_json")["steps"]
             for name in ("gray.png", "deep.png", "saturated.png")}  # the confidences follow the pixels
    assert steps["deep.png"] == steps["gray.png"] != steps["saturated.png"]

    # /replay: the record's embedded image goes through the same checks
    run = get_run(SHIPPED_LABEL)
    state = run_caption(SHIPPED_LABEL, show_scene(3, SHIPPED_LABEL, None)[0],
                        *(getattr(run.cfg.sampler, f) for f in SAMPLER_FIELDS))[0]
    record = json.loads(Path(save_json(state)).read_text())
    for name, png, message in (("bomb", _bomb_png(20000, 20000), "too large"),
                               ("text", b"not an image", "not a readable image")):
        (tmp / f"{name}.json").write_text(json.dumps({**record, "image_png": base64.b64encode(png).decode()}))
        with pytest.raises(Exception, match=message) as err:  # noqa: PT011
            client.predict(path=handle_file(str(tmp / f"{name}.json")), api_name="/replay")
        assert str(err.value).startswith("the record's embedded image") and "\n" not in str(err.value)
    (tmp / "deep.json").write_text(json.dumps({**record, "image_png": base64.b64encode(_png(deep)).decode()}))
    client.predict(path=handle_file(str(tmp / "deep.json")), api_name="/replay")  # a 16-bit image is fine
    assert np.array_equal(np.asarray(record_image({"image_png": base64.b64encode(_png(deep)).decode()})),
                          np.asarray(gray.convert("RGB")))  # and scaled, not saturated
    for call, message in (({"scene": 3, "temperature": 5.0}, "greater than maximum value 2.0"),  # gradio's checks
                          ({"scene": 3, "run": "nope"}, "not in the list of choices")):
        with pytest.raises(Exception, match=message):  # noqa: PT011
            client.predict(api_name="/caption_json", **call)
    assert "Traceback" not in capfd.readouterr().err  # no rejected call printed one in the server's log
