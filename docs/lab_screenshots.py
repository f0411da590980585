"""Browser check of the teaching notebooks and the app: JupyterLab in headless Chromium runs notebooks 00 and 01 as
a student would, interrupts a training cell and resumes it, the app is driven with a prompt; screenshots in docs/.

    python docs/lab_screenshots.py [--out docs] [--only lesson,pretraining,interrupt,explorer]

Needs the [lab] extra (JupyterLab) and Debian's ``chromium`` (``apt-get install -y chromium``). What it does:

1. copies ``notebooks/`` into a temporary folder (JupyterLab autosaves; the tracked notebooks stay untouched) and
   starts JupyterLab there on a free loopback port with a random token and ``--LabApp.expose_app_in_browser``, so
   the script can call JupyterLab's own commands (what the menus call: ``notebook:run-all-cells``,
   ``kernelmenu:interrupt``);
2. starts Chromium headless with remote debugging (networking extras off, only 127.0.0.1 is contacted) and drives
   it over the DevTools protocol (``websocket-client``, a Jupyter dependency);
3. ``lesson``: opens 00, runs all cells with its defaults, checks that no cell failed, that figures are pictures
   and that every hidden solution passed, and screenshots the step-by-step unmasking and an exercise;
   ``pretraining``: the same for 01 (its defaults: ``make demo``'s model is reused when it was trained);
   ``interrupt``: 01 with a fresh models folder, Kernel > Interrupt during training, checks that the cell says
   where training stopped and that running it again resumes from that checkpoint, then interrupts again;
   ``explorer``: 05 with its defaults (the models of ``make demo`` or of 02-04 when trained, else the shipped
   captioner and an ARC trained there), no cell failed, both hidden solutions passed, then the trajectory
   explorer driven as a student would: another image chosen in its menu, the step slider's value typed in its
   readout; the canvas under it must show that image's caption at that step;
   ``clean``: opening any numbered notebook leaves it unchanged (nothing for JupyterLab to upgrade);
   ``app``: the app (``mdc app`` on the shipped model) with a prompt: the fixed words are written in the text
   line above the chips and the attention label is whole; "new random scene" empties the prompt and its caption
   has no fixed word.

Every check is an assert: the script fails loudly when the browser shows something else.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mdc_app.screenshot import CHROMIUM_FLAGS, find_chromium  # noqa: E402

WIDTH, HEIGHT = 1500, 1100


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout_s: float, what: str, every_s: float = 1.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


class Page:
    """One Chromium tab over the DevTools protocol: evaluate JavaScript, screenshot."""

    def __init__(self, debug_port: int):
        import websocket

        tabs = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{debug_port}/json").read())
        url = next(t["webSocketDebuggerUrl"] for t in tabs if t.get("type") == "page")
        self.ws = websocket.create_connection(url, timeout=600, suppress_origin=True)
        self.next_id = 0
        self.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1, mobile=False)
        self.call("Emulation.setFocusEmulationEnabled", enabled=True)  # a headless tab has no focus otherwise

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def js(self, expression: str, promise: bool = False):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=promise)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JavaScript failed: {result['exceptionDetails'].get('text')} in {expression[:200]}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        print(f"  screenshot {path}")
        return path


NB = "jupyterapp.shell.currentWidget"
KERNEL_IDLE = f"(() => {{ const k = {NB}.sessionContext.session?.kernel; return !!k && k.status === 'idle'; }})()"
STATE = f"""(() => {{
  const cells = {NB}.content.widgets.filter(c => c.model.type === 'code');
  const outs = cells.map(c => c.model.outputs.toJSON());
  return {{done: cells.every(c => c.model.executionCount !== null),
           errors: outs.flat().filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue),
           text: outs.flat().map(o => (o.text || '') + (o.data?.['text/markdown'] || '') + (o.data?.['image/png'] ? ''
                 : (o.data?.['text/plain'] || ''))).join('\\n'),
           pictures: {NB}.content.node.querySelectorAll('.jp-OutputArea-output img').length}};
}})()"""


def command(page: Page, name: str, args: dict | None = None, wait: bool = True) -> None:
    """Run one of JupyterLab's commands (what its menus and shortcuts run); with `wait`, until it returns (running
    cells returns when they finished: those are started without waiting)."""
    page.js(f"jupyterapp.commands.execute({json.dumps(name)}, {json.dumps(args or {})}).then(() => true)",
            promise=wait)


def open_notebook(page: Page, path: str) -> None:
    command(page, "docmanager:open", {"path": path})
    find = f"[...jupyterapp.shell.widgets('main')].find(w => w.context?.path === {json.dumps(path)})"
    _wait(lambda: page.js(f"!!{find}"), 60, f"{path} open")
    page.js(f"jupyterapp.shell.activateById({find}.id); {find}.content.activate(); true")
    _wait(lambda: page.js(f"{NB}?.context?.path === {json.dumps(path)}"), 60, f"{path} to be the current notebook")
    _wait(lambda: page.js(KERNEL_IDLE), 120, "the kernel to start")


def run_all(page: Page, timeout_s: float) -> dict:
    command(page, "notebook:run-all-cells", wait=False)
    state = _wait(lambda: (lambda s: s if (s["done"] or s["errors"]) and page.js(KERNEL_IDLE) else None)(
        page.js(STATE)), timeout_s, "all cells to run", every_s=3)
    assert not state["errors"], state["errors"]
    return state


def show_cell(page: Page, needle: str, offset: int = 0) -> int:
    """Scroll the first cell whose source holds `needle` (+ `offset` cells) to the top; its index."""
    found = f"c => c.model.sharedModel.getSource().includes({json.dumps(needle)})"
    index = page.js(f"{NB}.content.widgets.findIndex({found})")
    assert index >= 0, needle
    page.js(f"{NB}.content.activeCellIndex = {index + offset}; "
            f"{NB}.content.widgets[{index + offset}].node.scrollIntoView({{block: 'start'}})")
    time.sleep(1.5)
    return index


def lesson(page: Page, out: Path) -> None:
    print("00: run all cells with the defaults")
    open_notebook(page, "00_masked_diffusion_captioning.ipynb")
    start = time.monotonic()
    state = run_all(page, 1800)
    print(f"  ran in {time.monotonic() - start:.0f} s in the browser; {state['pictures']} pictures")
    assert "<Figure size" not in state["text"] and "PosixPath(" not in state["text"], state["text"][-2000:]
    assert state["pictures"] >= 4, state["pictures"]  # the data, the loss curve, the unmasking, the masks
    assert state["text"].count("\u2714") == 3, state["text"][-1500:]  # the three hidden solutions passed
    show_cell(page, "lesson.unmasking_figure")
    page.screenshot(out / "lab_lesson_unmasking.png")
    show_cell(page, "### Exercise 1")
    page.screenshot(out / "lab_lesson_exercise.png")


def pretraining(page: Page, out: Path) -> None:
    print("01: run all cells with the defaults")
    open_notebook(page, "01_pretraining.ipynb")
    start = time.monotonic()
    state = run_all(page, 3600)
    print(f"  ran in {time.monotonic() - start:.0f} s in the browser; {state['pictures']} pictures")
    assert "<Figure size" not in state["text"] and "PosixPath(" not in state["text"], state["text"][-2000:]
    assert state["pictures"] >= 5, state["pictures"]  # data, lengths, masking, loss curve, captions
    assert state["text"].count("\u2714") == 3, state["text"][-1500:]  # the three hidden solutions passed
    show_cell(page, "wb.train_cached(cfg, models_dir, live=True)", offset=-1)
    page.screenshot(out / "lab_pretraining_curve.png")
    show_cell(page, "after = sample(model")
    page.screenshot(out / "lab_pretraining_captions.png")


EXPLORER_CELL = "widgets.interact(show"


def explorer(page: Page, out: Path) -> None:
    print("05: run all cells with the defaults, then drive the trajectory explorer")
    open_notebook(page, "05_captioning.ipynb")
    start = time.monotonic()
    state = run_all(page, 3600)
    print(f"  ran in {time.monotonic() - start:.0f} s in the browser; {state['pictures']} pictures")
    assert "<Figure size" not in state["text"] and "PosixPath(" not in state["text"], state["text"][-2000:]
    assert state["text"].count("\u2714") == 2, state["text"][-1500:]  # the two hidden solutions passed
    index = show_cell(page, EXPLORER_CELL, offset=-1)
    show_cell(page, EXPLORER_CELL)
    cell = f"{NB}.content.widgets[{index}].node"
    canvas = f"{cell}.querySelector('.widget-output .mdc-canvas, .jp-OutputArea-output .mdc-canvas')"
    _wait(lambda: page.js(f"!!{cell}.querySelector('.widget-dropdown select') && !!{canvas}"), 120,
          "the explorer's menu, slider and canvas")
    first = page.js(f"{canvas}.outerHTML")
    page.js(f"""(() => {{ const s = {cell}.querySelector('.widget-dropdown select');
        s.value = s.options[1].value; s.dispatchEvent(new Event('change', {{bubbles: true}})); return true; }})()""")
    _wait(lambda: page.js(f"{canvas}?.outerHTML") not in (None, first), 60, "the canvas of the second image")
    page.js(f"""(() => {{ const r = {cell}.querySelector('.widget-slider .widget-readout');
        r.focus(); r.textContent = '3';
        r.dispatchEvent(new KeyboardEvent('keydown', {{key: 'Enter', keyCode: 13, which: 13, bubbles: true}}));
        r.blur(); return true; }})()""")
    _wait(lambda: page.js(f"{canvas}?.dataset.step") == "3", 60, "the canvas at step 3")
    time.sleep(1.5)
    revealed = page.js(f"{canvas}.querySelectorAll('[data-state=revealed]').length")
    assert revealed == 3, revealed  # one token per step (Eq. 6)
    page.screenshot(out / "lab_explorer.png")
    print(f"  explorer: image 1 chosen, step 3 shows {revealed} revealed tokens")


def interrupt(page: Page, out: Path, workdir: Path) -> None:
    print("01: Kernel > Interrupt during training, then resume")
    nb = json.loads((workdir / "01_pretraining.ipynb").read_text())
    params = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    models = workdir / "interrupt_models"
    params["source"] = [line if not line.startswith("models_dir") else
                        f'models_dir: str = "{models}"  # a fresh cache: this run must train\n'
                        for line in params["source"]]
    (workdir / "01_interrupt_check.ipynb").write_text(json.dumps(nb))
    open_notebook(page, "01_interrupt_check.ipynb")
    command(page, "notebook:run-all-cells", wait=False)
    metrics = lambda: [json.loads(x) for p in models.glob("*/metrics.jsonl") for x in p.read_text().splitlines()]
    checkpoints = lambda: sorted(int(p.name[5:]) for p in models.glob("*/checkpoints/step_*"))
    _wait(lambda: len(metrics()) >= 3, 1800, "three logged training steps")
    show_cell(page, "wb.train_cached(cfg, models_dir, live=True)")
    page.screenshot(out / "lab_interrupt_training.png")
    command(page, "kernelmenu:interrupt")  # the Kernel menu's Interrupt
    _wait(lambda: page.js(KERNEL_IDLE) and "training stopped at step" in page.js(STATE)["text"], 300,
          "the training cell to stop")
    stopped, logged = checkpoints()[-1], metrics()
    assert stopped >= logged[-1]["step"] and f"training stopped at step {stopped} " in page.js(STATE)["text"]
    time.sleep(5)
    assert metrics() == logged and checkpoints()[-1] == stopped, "training went on after the interrupt"
    state = page.js(STATE)
    assert any("TrainingInterrupted" in e for e in state["errors"]), state["errors"]
    show_cell(page, "wb.train_cached(cfg, models_dir, live=True)")
    page.screenshot(out / "lab_interrupt_stopped.png")
    print(f"  stopped at step {stopped} with its checkpoint; running the cell again")
    command(page, "notebook:run-cell", wait=False)
    _wait(lambda: "resuming mdc-" in page.js(STATE)["text"] and metrics()[-1]["step"] > stopped, 900,
          "the resumed training to log a step")
    show_cell(page, "wb.train_cached(cfg, models_dir, live=True)")
    page.screenshot(out / "lab_interrupt_resumed.png")
    command(page, "kernelmenu:interrupt")
    _wait(lambda: page.js(KERNEL_IDLE), 300, "the second interrupt")
    steps = [m["step"] for m in metrics()]
    assert steps == sorted(set(steps)) and checkpoints()[-1] > stopped, steps  # resumed, no step logged twice
    print(f"  resumed from step {stopped}, stopped again at step {checkpoints()[-1]}")


def clean(page: Page, workdir: Path) -> None:
    """Opening a notebook does not mark it changed (nbformat 4.5 with cell ids: nothing for JupyterLab to upgrade).
    Only the repository's notebooks: copies the other checks made (``01_interrupt_check.ipynb``) are not tracked."""
    for path in sorted((workdir / p.name) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        command(page, "docmanager:open", {"path": path.name})
        find = f"[...jupyterapp.shell.widgets('main')].find(w => w.context?.path === {json.dumps(path.name)})"
        _wait(lambda find=find: page.js(f"!!{find}"), 60, f"{path.name} open")
        page.js(f"{find}.context.ready.then(() => true)", promise=True)
        time.sleep(2)
        dirty = page.js(f"{find}.context.model.dirty")
        print(f"  {path.name}: {'CHANGED on open' if dirty else 'unchanged'} after opening")
        assert not dirty, f"JupyterLab marks {path.name} changed as soon as it opens it"
        command(page, "application:close-all")


APP_JS = """
window.mdcBox = () => [...document.querySelectorAll('label')].find(l => l.textContent.includes('fix some words'))
  .querySelector('textarea, input');
window.mdcClick = (text) => [...document.querySelectorAll('button')].find(b => b.textContent.trim() === text).click();
window.mdcCanvas = () => document.querySelector('.mdc-canvas');
window.mdcType = (text) => {
  const box = mdcBox(), proto = Object.getPrototypeOf(box);
  Object.getOwnPropertyDescriptor(proto, 'value').set.call(box, text);
  box.dispatchEvent(new Event('input', {bubbles: true}));
};
true
"""


def app(page: Page, out: Path) -> None:
    """The app on the shipped model: fixed words in the text line above the chips, the prompt dropped by a new
    scene, the attention label readable."""
    from mdc_app.launch import serve

    print("app: the shipped model, a prompt, a new scene")
    port = _free_port()
    demo = serve(None, root=None, port=port, block=False)
    try:
        page.call("Emulation.setDeviceMetricsOverride", width=1300, height=1750, deviceScaleFactor=1, mobile=False)
        page.call("Page.navigate", url=f"http://127.0.0.1:{port}/")
        _wait(lambda: page.js("!!document.querySelector('.mdc-canvas')"), 120, "the app's first caption")
        page.js(APP_JS)
        page.js("mdcType('a [MASK] [MASK] on a _ background')")
        time.sleep(1)
        page.js("mdcClick('unmask')")
        _wait(lambda: page.js("mdcCanvas().querySelectorAll('[data-state=fixed]').length") == 4, 120,
              "the caption with four fixed words")
        time.sleep(2)
        line = page.js("mdcCanvas().querySelector('span[style*=monospace]').textContent")
        assert line.split()[0] == "a" and line.split()[3:5] == ["on", "a"] and line.split()[-1] == "background", line
        assert "\u2581" not in line.split()[0], line  # the fixed words are written, not blanked
        label = page.js("[...document.querySelectorAll('div')].find(d => d.textContent.startsWith('where the token "
                        "just revealed looks')).textContent")
        assert label.startswith("where the token just revealed looks: '"), label
        page.screenshot(out / "app_prompt.png")
        print(f"  fixed words shown: {line!r}; {label!r}")
        page.js("mdcClick('new random scene')")
        _wait(lambda: page.js("mdcBox().value") == "" and
              page.js("mdcCanvas().querySelectorAll('[data-state=fixed]').length") == 0, 120,
              "the new scene's caption without the old prompt")
        time.sleep(2)
        page.screenshot(out / "app_new_scene.png")
        print(f"  new scene: prompt box empty, caption {page.js('mdcCanvas().dataset.step')} steps, no fixed word")
    finally:
        demo.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs"), help="folder for the screenshots")
    parser.add_argument("--only", default="lesson,pretraining,interrupt,explorer,clean,app",
                        help="comma-separated checks to run (lesson, pretraining, interrupt, explorer, clean, app)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    exe = find_chromium()
    if exe is None:
        raise SystemExit("no Chromium found; install it with: apt-get install -y chromium")
    from mdc_workbench.runs.plans import ensure_kernel

    ensure_kernel()
    with tempfile.TemporaryDirectory(prefix="mdc-lab-") as tmp:
        workdir = Path(tmp) / "notebooks"
        shutil.copytree(ROOT / "notebooks", workdir)
        port, debug_port, token = _free_port(), _free_port(), secrets.token_hex(16)
        lab_cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                   f"--ServerApp.root_dir={workdir}", f"--IdentityProvider.token={token}",
                   "--LabApp.expose_app_in_browser=True", f"--LabApp.workspaces_dir={Path(tmp) / 'workspaces'}"]
        if hasattr(os, "getuid") and os.getuid() == 0:
            lab_cmd.append("--allow-root")
        settings = Path(tmp) / "settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)  # no "get notified about Jupyter news?" toast over the screenshots
        (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
        env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(Path(tmp) / "settings")}
        lab = subprocess.Popen(lab_cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        chromium = subprocess.Popen([exe, *CHROMIUM_FLAGS, f"--remote-debugging-port={debug_port}",
                                     f"--user-data-dir={Path(tmp) / 'profile'}", f"--window-size={WIDTH},{HEIGHT}",
                                     "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait(lambda: _up(f"http://127.0.0.1:{port}/lab?token={token}"), 120, "JupyterLab")
            _wait(lambda: _up(f"http://127.0.0.1:{debug_port}/json"), 60, "Chromium")
            page = Page(debug_port)
            page.call("Page.navigate", url=f"http://127.0.0.1:{port}/lab?token={token}")
            _wait(lambda: page.js("!!window.jupyterapp && !!document.querySelector('.jp-LabShell')"), 120,
                  "JupyterLab's page")
            page.js("jupyterapp.restored.then(() => true)", promise=True)  # the (empty) layout is restored
            checks = set(args.only.split(","))
            if "lesson" in checks:
                lesson(page, out)
            if "pretraining" in checks:
                pretraining(page, out)
            if "interrupt" in checks:
                interrupt(page, out, workdir)
            if "explorer" in checks:
                explorer(page, out)
            if "clean" in checks:
                clean(page, workdir)
            if "app" in checks:
                app(page, out)
            print("browser check passed")
        finally:
            for proc in (chromium, lab):  # JupyterLab shuts its kernels down on SIGTERM
                proc.terminate()
            for proc in (chromium, lab):
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


if __name__ == "__main__":
    main()
