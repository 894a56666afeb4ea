"""``make demo`` resumes an interrupted training from its last checkpoint (issue 58: a stopped demo kept nothing).

The demo's model rule, run through make on toy copies of the demo config: a training that started and did not
end (no ``train.end`` newer than ``train.start``) resumes from the last checkpoint; after one that ended, the
rule trains afresh.  The progress lines end in the time left (issue 58).
"""

import re
import subprocess

import pytest
import yaml

import support

pytestmark = pytest.mark.slow


def _make(demo, config, steps):
    return subprocess.run(["make", "--no-print-directory", "-o", "build/tatoeba/vocab.en", f"DEMO={demo}", f"DEMO_CONFIG={config}",
                           f"{demo}/model_step_{steps}.pt"], cwd=support.REPO, capture_output=True, text=True,
                          timeout=900, env=support.cli_env())


def _config(path, demo, steps):
    config = yaml.safe_load((support.REPO / "yaml_configs/demo/tatoeba_zhen.yaml").read_text(encoding="utf-8"))
    config.update(train_steps=steps, save_checkpoint_steps=2, valid_steps=100, report_every=1,
                  save_model=f"{demo}/model", save_data=f"{demo}/samples", enc_layers=1, dec_layers=1)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")


def test_an_interrupted_demo_training_resumes(sample_data, tmp_path):
    demo, toy = tmp_path / "demo", tmp_path / "demo.yaml"
    _config(toy, demo, 2)
    first = _make(demo, toy, 2)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "-overwrite_checkpoints" in first.stdout and "resuming" not in first.stdout
    (demo / "train.end").unlink()  # as if stopped after its step-2 checkpoint
    _config(toy, demo, 4)
    resumed = _make(demo, toy, 4)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming the interrupted training from {demo}/model_step_2.pt" in resumed.stdout
    assert f"-train_from {demo}/model_step_2.pt" in resumed.stdout
    assert (demo / "model_step_4.pt").is_file() and (demo / "train.end").is_file()
    # the progress line ends in the time left, from the resumed run's own steps; the last step has none
    steps = [line for line in resumed.stderr.splitlines() if " Step " in line]
    assert re.search(r"Step +3/ +4;.* sec; about \d\d:\d\d left;$", steps[0]), steps
    assert steps[-1].endswith(" sec;") and "Step  4/    4;" in steps[-1], steps
    _config(toy, demo, 6)  # a training that ended: the next one starts afresh
    again = _make(demo, toy, 6)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "resuming" not in again.stdout and "-overwrite_checkpoints" in again.stdout
