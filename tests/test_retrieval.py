"""probes/retrieval.py on a small bank: the family vault's name form makes the bank serve a vault a lesson of its
own family (the task's property that issue 86 asks of it, measured 1.00 held out on 64 lessons and 256 vaults)."""
from embedder import Embedder
from probes import retrieval


def test_a_family_vault_is_served_its_familys_lessons():
    out = retrieval.probe("vault-family", Embedder(), lessons=16, queries=16, iters=1)
    assert set(out) == {"held_out", "held_out/control", "training"}
    assert out["held_out"]["family"] >= 0.9 and out["held_out"]["door"] >= 0.9 and out["held_out"]["served"] == 1
    assert out["held_out/control"]["family"] == 0     # no lesson of a control family exists
