"""The app's /config (served to every visitor) names run folders relative to --root, never by absolute path."""

import json

from mdc_app.layout import build_app
from mdc_app.runs import get_run

from mdc_core.checkpoint import save_checkpoint
from tests.app.test_app import _micro_run


def test_config_holds_no_absolute_run_path(tmp_path):
    root = tmp_path / "runs"
    model, cfg = _micro_run()
    save_checkpoint(root / "exp" / "served", 1, cfg, model)
    save_checkpoint(root / "exp" / "other", 1, cfg, model)
    served = str((root / "exp" / "served").resolve())
    demo = build_app({served: (model, cfg)}, root=root, default=served)
    config = json.dumps(demo.get_config_file(), default=str)
    assert str(tmp_path) not in config and str(tmp_path.resolve()) not in config
    assert '"exp/served"' in config and '"exp/other"' in config  # the run menu's values, relative to the root
    assert get_run("exp/other").cfg.model == cfg.model
