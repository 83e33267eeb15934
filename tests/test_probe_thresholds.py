"""How the probe's abstention thresholds are chosen on dev (judge/probe_fit._choose_thresholds),
on probabilities made for the purpose: no model is read."""
import torch

from clawrl.judge import probe
from clawrl.judge.corpus import metrics
from clawrl.judge.probe import decide
from clawrl.judge.probe_fit import _choose_thresholds


def _rows(spec):
    """`spec`: (gold label, p(-1), p(+1), copies); p(0) is the rest."""
    probs, gold = [], []
    for label, pn, pp, copies in spec:
        probs += [[pn, 1 - pn - pp, pp]] * copies
        gold += [label] * copies
    return torch.tensor(probs), gold


def test_the_thresholds_find_the_floors_with_the_fewest_wrong_signs():
    # 86 of 100 corrections are sure; the other 14 sit at p(-1) = 0.62 beside two approvals that
    # look like corrections. Reading those 14 too would gain more right votes than the net rule
    # charges for the two wrong signs, but the floors are met without them, and without a wrong
    # sign: so the correction threshold stays above 0.62.
    probs, gold = _rows([(-1, 0.95, 0.02, 86), (-1, 0.62, 0.05, 14),
                         (1, 0.02, 0.95, 100), (1, 0.62, 0.20, 2), (0, 0.10, 0.10, 50)])
    tn, tp, dev = _choose_thresholds(probs, gold)
    m = metrics(gold, decide(probs, tn, tp))
    floor_c, floor_a = probe.RECALL_FLOORS
    assert m["correction_recall"] >= floor_c and m["approval_recall"] >= floor_a
    assert tn > 0.62
    assert m["wrong_sign_rate"] == 0 and dev["wrong_sign_rate"] == 0


def test_out_of_reach_floors_fall_back_to_right_votes_less_the_wrong_ones():
    # Half the corrections look exactly like approvals: no threshold finds 85 % of them without
    # reading every such approval as a correction, so the net rule decides.
    probs, gold = _rows([(-1, 0.9, 0.05, 50), (-1, 0.5, 0.45, 50),
                         (1, 0.5, 0.45, 50), (1, 0.05, 0.9, 50), (0, 0.1, 0.1, 20)])
    tn, tp, dev = _choose_thresholds(probs, gold)
    assert dev["correction_recall"] < probe.RECALL_FLOORS[0]
    assert dev["wrong_sign_rate"] <= probe.MAX_WRONG_SIGN
    assert tn > 0.5                   # the ambiguous rows are left at 0


def test_a_vote_is_never_the_less_likely_sign():
    # p(+1) reaches the approval threshold, but the head finds a correction likelier: no vote
    probs = torch.tensor([[0.56, 0.02, 0.42], [0.30, 0.02, 0.68], [0.80, 0.05, 0.15], [0.45, 0.10, 0.45]])
    assert decide(probs, threshold=0.76, approval=0.40) == [0, 1, -1, 0]
    assert decide(probs, threshold=0.40, approval=0.40) == [-1, 1, -1, -1]     # a tie is a correction
