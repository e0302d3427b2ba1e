"""The simulated-learner claims (analysis/claims_learners.py, claims_minibatch.py): their numbers
from run frames (sums over epochs, per-learner batch)."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import claims_learners as claims
from analysis import claims_minibatch
from analysis.load import IDENTITY, Frames


def _frames() -> Frames:
    """Three runs: AdaComp on 1 and 4 learners (SGD), no compression on 1 (SGD); two epochs."""
    settings = [("a", "adacomp", 1), ("b", "adacomp", 4), ("c", "none", 1)]
    runs = pd.DataFrame([{
        "run_id": rid, **dict.fromkeys(IDENTITY, "x"), "method": f"{comp}-{w}", "seed": 0,
        "baseline": "none", "metric": "test/accuracy", "final": 50.0 + w, "best": 60.0,
        "compressor.name": comp, "optimizer.name": "sgd", "trainer.workers": w,
        "trainer.batch_size": 128} for rid, comp, w in settings])
    rows = []
    for rid, comp, w in settings:
        for epoch, (conv, fc) in enumerate([(100.0, 10.0), (300.0, 30.0)]):
            sent = comp != "none"
            rows.append({"run_id": rid, "epoch": epoch, "comm/bits": 1.0, "comm/bits_dense": 2.0,
                         "time/epoch_s": 1.0,
                         "comm/bits_conv": conv / w if sent else 0.0,
                         "comm/bits_dense_conv": 4000.0 if sent else 0.0,
                         "comm/bits_fc": fc if sent else 0.0,
                         "comm/bits_dense_fc": 8000.0 if sent else 0.0})
    return Frames(runs, pd.DataFrame(rows), pd.DataFrame())


def test_claim_data_sums_bits_over_the_run_and_divides_the_batch() -> None:
    data = claims.claim_data(_frames()).set_index(["compressor", "learners"])
    one, four = data.loc[("adacomp", 1)], data.loc[("adacomp", 4)]
    assert one["conv_x"] == pytest.approx(8000 / 400)        # dense / sent, both summed
    assert four["conv_x"] == pytest.approx(8000 / 100)
    assert one["fc_x"] == pytest.approx(16000 / 40)
    assert (one["per_learner_batch"], four["per_learner_batch"]) == (128, 32)
    assert pd.isna(data.loc[("none", 1), "conv_x"])           # nothing compressed: no rate


def test_learners_table_puts_the_baseline_first() -> None:
    table = claims.learners_table(claims.claim_data(_frames()))
    assert list(table["compressor"]) == ["none", "adacomp", "adacomp"]
    assert list(table["learners"]) == [1, 1, 4]
    assert table.iloc[2]["momentum SGD: conv"] == "80.0x"
    assert table.iloc[0]["momentum SGD: conv"] == "—"


def test_tables_show_the_spread_over_seeds() -> None:
    frames = _frames()
    twin = frames.runs[frames.runs["run_id"] == "b"].assign(run_id="b2", seed=1, final=58.0)
    epochs = frames.epochs[frames.epochs["run_id"] == "b"].assign(run_id="b2")
    frames = Frames(pd.concat([frames.runs, twin]), pd.concat([frames.epochs, epochs]),
                    frames.problems)
    data = claims.claim_data(frames)
    table = claims.learners_table(data).set_index("learners")
    assert table.loc[4, "momentum SGD: accuracy (%)"] == "56.00 ± 2.83"  # 54 and 58
    assert table.loc[4, "seeds"] == 2
    assert table[table["compressor"] == "adacomp"].loc[1, "momentum SGD: accuracy (%)"] == "51.00"
    batch = claims_minibatch.batch_table(data).set_index("learners")
    assert batch.loc[4, "accuracy (%)"] == "56.00 ± 2.83"
