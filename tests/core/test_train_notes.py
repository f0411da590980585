"""``mdc train``'s console notes: a run that never leaves warm-up, truncation with its total and advice, the
first logged step and the corpus vocabulary line."""

from mdc_workbench.cli.train import truncation_note, warmup_note


def test_warmup_note_only_when_the_run_never_leaves_warm_up():
    from mdc_core.train import lr_lambda
    assert warmup_note(101, 100) == "" and warmup_note(0, 0) == ""
    assert warmup_note(100, 100) == ""  # the last step reaches the peak: lr_lambda(99, 100, ...) = 1
    assert lr_lambda(99, 100, 100, 0.0) == 1.0
    note = warmup_note(30, 100)
    assert "--steps 30 < train.warmup_steps 100" in note and "30% of train.lr" in note
    assert lr_lambda(29, 100, 30, 0.0) == 0.3  # what the note says: the last step's multiplier
    assert "train.warmup_steps=N" in note


def test_truncation_note_gives_the_total_share_and_the_fix():
    note = truncation_note(284, 1920, 64)
    assert "context of 64 tokens: 284 of about 1920 (15%)" in note
    assert "--captions short" in note and "model.context_length" in note
    assert "of about" not in truncation_note(3, 0, 64)  # a total it does not know is not made up


def test_the_first_step_is_logged_at_once_and_the_vocabulary_line_says_what_it_read(tmp_path, capsys):
    import torch

    from mdc_core.train import train
    from tests.train_helpers import micro_run, read_metrics, write_micro_data

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = write_micro_data(tmp_path / "data", 24)
        train(micro_run(data, steps=4, batch_size=8, log_every=3, ckpt_every=4), tmp_path / "run", progress=True)
    finally:
        torch.set_num_threads(threads)
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 3, 4]  # step 1, the cadence, the last
    err = capsys.readouterr()
    line = next(x for x in (err.out + err.err).splitlines() if x.startswith("corpus vocabulary:"))
    assert line.endswith("token ids from 24 training captions") and int(line.split()[2]) > 1
