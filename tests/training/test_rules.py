"""Every training rule on constructed histories: one that must trigger it and one that must not, with
the numbers worked out by hand; and the watchdog's once-per-place alerts and stop."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bertology.errors import BertologyError
from bertology.training.rules import (
    RULES,
    Alert,
    AttentionRecord,
    ClassImbalance,
    DevRecord,
    EntropyCollapse,
    ExplodingGradient,
    FrozenHeads,
    History,
    LossNotDecreasing,
    LossRecord,
    NoOpHeads,
    OneClassPredictions,
    Overfitting,
    SaturatedActivation,
    SignalRecord,
    StalledTraining,
    VanishingGradient,
    Watchdog,
    WeightUpdateRatio,
    rule_names,
)
from bertology.training.rules.smdebug import records_read

GROUPS = ("embeddings", "layer 0", "head")


def signals(step: int = 10, *, rate: float = 1e-4, **arrays: list[float]) -> SignalRecord:
    """A record of three groups of 100 weights each: healthy numbers unless given."""
    values = {
        "parameters": [100, 100, 100],
        "gradient_norm": [0.5, 0.5, 0.5],
        "weight_norm": [2.0, 2.0, 2.0],
        "update_norm": [2e-3, 2e-3, 2e-3],
        "saturation": [math.nan, 0.1, 0.2],
    } | arrays
    return SignalRecord(step, rate, GROUPS, **{name: np.array(v) for name, v in values.items()})  # type: ignore[arg-type]


def found(rule: object, history: History) -> list[str]:
    """The places where ``rule`` fires on ``history``."""
    return [finding.where for finding in rule.check(history)]  # type: ignore[attr-defined]


def test_vanishing_gradient_on_the_rms_gradient() -> None:
    # RMS = norm / sqrt(100): 5e-7 / 10 = 5e-8 < 1e-7 fires; 2e-6 / 10 = 2e-7 does not.
    history = History(signals=[signals(gradient_norm=[5e-7, 2e-6, 0.5])])
    assert found(VanishingGradient(), history) == ["embeddings"]
    frozen_group = History(signals=[signals(gradient_norm=[0.0, 0.5, 0.5], parameters=[0, 100, 100])])
    assert found(VanishingGradient(), frozen_group) == []  # a group that does not train has no gradient
    assert found(VanishingGradient(), History(signals=[signals()])) == []


def test_exploding_gradient_on_the_norm_and_the_loss() -> None:
    # The norm over all groups: sqrt(3 x 600^2) = 1039 > 1000; sqrt(3 x 500^2) = 866 is not.
    assert found(ExplodingGradient(), History(signals=[signals(gradient_norm=[600, 600, 600])])) == [
        "gradients"
    ]
    assert found(ExplodingGradient(), History(signals=[signals(gradient_norm=[500, 500, 500])])) == []
    assert found(ExplodingGradient(), History(signals=[signals(gradient_norm=[0.5, math.inf, 0.5])])) == [
        "gradients"
    ]
    assert found(ExplodingGradient(), History(train=[LossRecord(1, 0.7), LossRecord(2, math.nan)])) == [
        "training loss"
    ]


def diverged(losses: list[float], window: int, growth: float) -> bool:
    """The divergence condition as the rule states it, by hand: the mean of the last ``window`` losses
    (fewer at the start) against ``growth`` times the lowest such mean before it."""
    means = [sum(losses[max(0, i + 1 - window) : i + 1]) / (i + 1 - max(0, i + 1 - window))
             for i in range(len(losses))]  # fmt: skip
    return means[-1] > growth * min(means[:-1])


@pytest.mark.parametrize("window", [1, 3, 10])
def test_exploding_gradient_on_the_running_mean_of_the_training_loss(window: int) -> None:
    rule = ExplodingGradient(window=window)
    # Steps 1-12 at 0.5 (every running mean 0.5), then one step whose loss puts the running mean exactly
    # at 10 x 0.5 (the boundary: silent), or a little past it (fires).
    flat = [0.5] * 12
    at = 5.0 * window - 0.5 * (window - 1)  # the mean of window - 1 steps at 0.5 and this one is 5.0
    for last, fires in [(at, False), (at + 1e-6, True), (at - 1e-6, False)]:
        losses = [*flat, last]
        assert diverged(losses, window, 10.0) is fires
        history = History(train=[LossRecord(step, loss) for step, loss in enumerate(losses, start=1)])
        assert found(rule, history) == (["training loss"] if fires else [])


def test_exploding_gradient_says_how_many_steps_its_mean_holds() -> None:
    # At step 4 the 10-step running mean holds 4 steps: (0.5 + 0.5 + 0.5 + 20.5) / 4 = 5.5 > 10 x 0.5.
    rows = [LossRecord(step, loss) for step, loss in enumerate([0.5, 0.5, 0.5, 20.5], start=1)]
    (finding,) = ExplodingGradient().check(History(train=rows))
    assert finding.what == "training loss 5.5 (mean of the last 4 steps), from 0.5"
    rows = [LossRecord(step, 0.5) for step in range(1, 13)] + [LossRecord(13, 100.5)]
    (finding,) = ExplodingGradient().check(History(train=rows))
    assert (
        finding.what == "training loss 10.5 (mean of the last 10 steps), from 0.5"
    )  # (9 x 0.5 + 100.5) / 10
    (finding,) = ExplodingGradient().check(History(train=[LossRecord(1, math.nan)]))
    assert finding.what == "training loss nan (one step)"


def test_exploding_gradient_is_silent_on_one_unlucky_batch() -> None:
    # A healthy run late in training: batch losses 0.05 and 0.6 (12 x 0.05) alternate. The running mean of
    # 10 steps stays at 0.325; the single batches would cross 10 x their lowest at every 0.6.
    losses = [0.05, 0.6] * 20
    rows = [LossRecord(step, loss) for step, loss in enumerate(losses, start=1)]
    for end in range(2, len(rows) + 1):  # the watchdog evaluates the rule at every step
        assert not diverged(losses[:end], 10, 10.0)
        assert found(ExplodingGradient(), History(train=rows[:end])) == []
    assert found(ExplodingGradient(window=1), History(train=rows[:2])) == ["training loss"]


def test_exploding_gradient_on_the_dev_loss() -> None:
    def dev(*losses: float) -> History:
        return History(dev=[DevRecord(100 * i, loss, 0.5) for i, loss in enumerate(losses, start=1)])

    assert found(ExplodingGradient(), dev(0.4, 0.3, 3.0)) == []  # exactly 10 x the lowest, 0.3
    assert found(ExplodingGradient(), dev(0.4, 0.3, 3.0001)) == ["dev loss"]
    assert found(ExplodingGradient(), dev(0.4, math.inf)) == ["dev loss"]
    assert found(ExplodingGradient(), dev(0.4)) == []  # nothing to rise from


def test_weight_update_ratio_too_small_and_too_large() -> None:
    record = signals(update_norm=[1e-8, 3.0, 2e-3])  # ratios 5e-9, 1.5, 1e-3
    assert found(WeightUpdateRatio(), History(signals=[record])) == [
        "embeddings (too small)",
        "layer 0 (too large)",
    ]
    assert found(WeightUpdateRatio(), History(signals=[signals()])) == []
    # A step with a learning rate of 0 (the first step of a warm-up) moves nothing and is skipped.
    still = History(signals=[signals(rate=0.0, update_norm=[0.0, 0.0, 0.0])])
    assert found(WeightUpdateRatio(), still) == []


def test_saturated_activation_above_half() -> None:
    assert found(SaturatedActivation(), History(signals=[signals(saturation=[math.nan, 0.6, 0.5])])) == [
        "layer 0"
    ]
    assert found(SaturatedActivation(), History(signals=[signals()])) == []


def test_loss_not_decreasing_over_windows() -> None:
    rule = LossNotDecreasing(window=10, patience=2, min_decrease=0.01)
    # Windows (steps 1-10, 11-20, ...) of rows every 5 steps; means 1.0, 0.8, then 0.795 and 0.81:
    # neither of the last two windows is below 0.99 x 0.8 = 0.792.
    flat = [LossRecord(s, v) for s, v in [(5, 1.0), (10, 1.0), (15, 0.8), (20, 0.8), (25, 0.79), (30, 0.8),
                                            (35, 0.81), (40, 0.81)]]  # fmt: skip
    assert found(rule, History(train=flat)) == ["training loss"]
    falling = [*flat[:6], LossRecord(35, 0.78), LossRecord(40, 0.78)]  # 0.78 < 0.792
    assert found(rule, History(train=falling)) == []
    assert found(rule, History(train=flat[:4])) == []  # not yet patience + 1 windows
    assert found(rule, History(train=flat[:7])) == []  # the fourth window is not complete


def test_overfitting_needs_dev_loss_up_and_training_loss_down() -> None:
    rule = Overfitting(min_rise=0.05, window=10)
    train = [LossRecord(s, 1.0 - s / 100) for s in range(5, 45, 5)]  # 0.95, 0.90, ... falling
    dev = [DevRecord(10, 0.60, 0.7), DevRecord(20, 0.55, 0.8)]
    # 0.58 >= 1.05 x 0.55 = 0.5775, the lowest earlier dev loss (step 20), while the training loss fell
    # from 0.825 (rows at steps 15 and 20) to 0.725 (steps 25 and 30).
    findings = rule.check(History(train=train, dev=[*dev, DevRecord(30, 0.58, 0.8)]))
    assert [finding.where for finding in findings] == ["dev loss"]
    assert (
        "from 0.5500 (step 20) to 0.5800" in findings[0].what and "from 0.8250 to 0.7250" in findings[0].what
    )
    assert found(rule, History(train=train, dev=[*dev, DevRecord(30, 0.57, 0.8)])) == []  # 0.57 < 0.5775
    flat_train = [LossRecord(s, 0.9) for s in range(5, 45, 5)]
    assert found(rule, History(train=flat_train, dev=[*dev, DevRecord(30, 0.60, 0.8)])) == []


def test_stalled_training_when_no_weight_moves() -> None:
    still = [signals(step, update_norm=[0.0, 1e-12, 0.0]) for step in (10, 20)]  # 1e-12 / 3.46 < 1e-10
    assert found(StalledTraining(), History(signals=still)) == ["weights"]
    assert found(StalledTraining(), History(signals=still[:1])) == []  # one record is not enough
    moving = [still[0], signals(20)]
    assert found(StalledTraining(), History(signals=moving)) == []
    nothing_trains = [signals(step, parameters=[0, 0, 0], update_norm=[0, 0, 0]) for step in (10, 20)]
    assert found(StalledTraining(), History(signals=nothing_trains)) == ["weights"]


def test_class_imbalance_of_the_training_labels() -> None:
    assert found(ClassImbalance(), History(label_counts={"0": 50, "1": 5})) == ["training labels"]  # 10 x
    assert found(ClassImbalance(), History(label_counts={"0": 49, "1": 5})) == []  # 9.8 x
    assert found(ClassImbalance(), History(label_counts={"0": 3, "1": 0})) == ["training labels"]


def evaluated(predictions: list[int], labels: list[int], accuracy: float | None = None) -> History:
    """A history whose one dev evaluation predicted ``predictions`` for examples of ``labels`` (0 or 1)."""
    confusion = np.zeros((2, 2), dtype=int)
    np.add.at(confusion, (labels, predictions), 1)
    right = float(np.mean(np.array(labels) == np.array(predictions)))
    dev = DevRecord(25, 0.69, right if accuracy is None else accuracy, confusion)
    return History(dev=[dev], label_counts={"negative": 60, "positive": 40})


@pytest.mark.parametrize(
    ("ones", "expected"),
    [(20, True), (19, True), (18, False)],  # of 20 predictions: 100 %, 95 % (the boundary), 90 %
)
def test_one_class_predictions_at_95_percent(ones: int, expected: bool) -> None:
    labels = [0, 1] * 10  # a balanced dev set: 50 % of each label
    predictions = [1] * ones + [0] * (20 - ones)
    assert found(OneClassPredictions(), evaluated(predictions, labels)) == (
        ["dev predictions"] if expected else []
    )


def test_one_class_predictions_message_and_what_it_skips() -> None:
    # The run: every dev prediction one label, dev accuracy 0.495 (99 of 200 dev examples have it).
    labels = [1] * 99 + [0] * 101
    (finding,) = OneClassPredictions().check(evaluated([1] * 200, labels))
    assert finding.what == (
        "200 of the 200 dev predictions are label 'positive', which 99 of the dev examples have; "
        "dev accuracy 0.495"
    )
    # A dev set that is itself 95 % one label: predicting it everywhere is not the rule's finding.
    assert found(OneClassPredictions(), evaluated([0] * 20, [0] * 19 + [1])) == []
    # Undefined accuracy (logits not finite; the arg-max of NaN picks label 0 everywhere): skipped.
    assert found(OneClassPredictions(), evaluated([0] * 20, [0, 1] * 10, accuracy=math.nan)) == []
    # No predictions recorded (the Trainer callback's evaluations): nothing to read.
    assert found(OneClassPredictions(), History(dev=[DevRecord(25, 0.69, 0.5)])) == []
    # Without the labels' names (or with another number of them), the label's index.
    history = evaluated([1] * 20, [0, 1] * 10)
    history.label_counts = None
    assert "are label 1, which 10 of the dev examples have" in OneClassPredictions().check(history)[0].what


def test_one_class_predictions_is_a_default_rule_that_reads_the_confusion_matrix() -> None:
    assert "one_class_predictions" in RULES and records_read(RULES.values()) == {"confusion"}


LAYERS, HEADS = 2, 3
NAMES = ("cls", "sep", "entropy")


def attention(
    step: int, change: np.ndarray | None = None, **heads: list[tuple[tuple[int, int], float]]
) -> AttentionRecord:
    """A record of 2 x 3 heads, each with cls 0.1, sep 0.1 and entropy 2.0 nats except the heads given
    as ``name=[((layer, head), value), ...]``."""
    stats = np.stack([np.full((LAYERS, HEADS), value) for value in (0.1, 0.1, 2.0)])
    for name, places in heads.items():
        for (layer, head), value in places:
            stats[NAMES.index(name), layer, head] = value
    return AttentionRecord(step, NAMES, stats, change)


def test_entropy_collapse_per_head_and_per_layer() -> None:
    first = attention(0)
    # Head (1, 2): 0.15 <= 0.25 x 2.0 and <= 0.2: collapsed. Head (0, 0) at 0.3 is low but above 0.2.
    history = History(attention=[first, attention(10, entropy=[((1, 2), 0.15), ((0, 0), 0.3)])])
    assert found(EntropyCollapse(), history) == ["layer 1 head 2"]
    assert EntropyCollapse().check(history)[0].head == (1, 2)
    # Layer 0: every head at 0.1, so its mean collapses too.
    layer = [((0, head), 0.1) for head in range(HEADS)]
    assert found(EntropyCollapse(), History(attention=[first, attention(10, entropy=layer)])) == [
        "layer 0 head 0", "layer 0 head 1", "layer 0 head 2", "layer 0",
    ]  # fmt: skip
    # A head that started low (0.1 nats) and stayed there has not collapsed during training.
    low = attention(0, entropy=[((1, 1), 0.1)])
    assert found(EntropyCollapse(), History(attention=[low, attention(10, entropy=[((1, 1), 0.09)])])) == []


def test_entropy_collapse_needs_a_head_that_started_above_the_floor() -> None:
    # Two heads fall to 0 nats: (0, 1) from exactly the floor (0.5 nats: silent), (1, 0) from just above it.
    # Their layers' means stay far above 0.2.
    start = attention(0, entropy=[((0, 1), 0.5), ((1, 0), 0.5001)])
    now = attention(10, entropy=[((0, 1), 0.0), ((1, 0), 0.0)])
    first, last = start.statistic("entropy"), now.statistic("entropy")
    expected = [
        f"layer {layer} head {head}"
        for layer in range(LAYERS)
        for head in range(HEADS)
        if first[layer, head] > 0.5 and last[layer, head] <= min(0.25 * first[layer, head], 0.2)
    ]
    assert expected == ["layer 1 head 0"]
    assert found(EntropyCollapse(), History(attention=[start, now])) == expected
    assert found(EntropyCollapse(floor=0.4), History(attention=[start, now])) == [
        "layer 0 head 1", "layer 1 head 0"
    ]  # fmt: skip


def test_no_op_heads_above_threshold_and_rising() -> None:
    first = attention(0, sep=[((0, 1), 0.5), ((1, 0), 0.85)])
    now = attention(10, cls=[((0, 1), 0.3), ((1, 0), 0.1)], sep=[((0, 1), 0.65), ((1, 0), 0.85)])
    # (0, 1): 0.95 >= 0.9, up from 0.6; (1, 0): 0.95, but up only from 0.95 (no rise).
    assert found(NoOpHeads(), History(attention=[first, now])) == ["layer 0 head 1"]
    below = attention(10, sep=[((0, 1), 0.75)])  # 0.85 < 0.9
    assert found(NoOpHeads(), History(attention=[first, below])) == []


def test_no_op_heads_needs_a_rise_of_0_3() -> None:
    # [CLS] + [SEP] mass before -> after (sep 0.1 unless given): (0, 0) 0.79 -> 0.91, a healthy drift as
    # layer 4 head 5 of a real run shows; (0, 1) 0.64 -> 0.95, up 0.31; (1, 2) 0.66 -> 0.95, up 0.29.
    first = attention(0, cls=[((0, 0), 0.59), ((0, 1), 0.54), ((1, 2), 0.56)], sep=[((0, 0), 0.2)])
    now = attention(10, cls=[((0, 0), 0.71), ((0, 1), 0.85), ((1, 2), 0.85)], sep=[((0, 0), 0.2)])
    before = first.statistic("cls") + first.statistic("sep")  # type: ignore[operator]
    after = now.statistic("cls") + now.statistic("sep")  # type: ignore[operator]
    hits = zip(*np.nonzero((after >= 0.9) & (after - before >= 0.3)), strict=True)
    expected = [f"layer {layer} head {head}" for layer, head in hits]
    assert expected == ["layer 0 head 1"]
    assert found(NoOpHeads(), History(attention=[first, now])) == expected


def test_frozen_heads_unchanged_across_records() -> None:
    moving = np.full((LAYERS, HEADS), 1e-4)
    still = moving.copy()
    still[1, 1] = 0.0
    records = [attention(0), attention(10, change=still), attention(20, change=still)]
    assert found(FrozenHeads(), History(attention=records)) == ["layer 1 head 1"]
    assert found(FrozenHeads(), History(attention=records[:2])) == []  # one unchanged pair is not enough
    again = [attention(0), attention(10, change=still), attention(20, change=moving)]
    assert found(FrozenHeads(), History(attention=again)) == []


def test_watchdog_raises_each_place_once_and_stops() -> None:
    watchdog = Watchdog([VanishingGradient(), ClassImbalance()], stop_on=["vanishing_gradient"])
    assert watchdog.labels({"0": 10, "1": 10}) == []
    assert watchdog.stop is None
    first = watchdog.signals(signals(10, gradient_norm=[1e-9, 0.5, 0.5]))
    assert first == [
        Alert("vanishing_gradient", 10, "embeddings: RMS gradient 1.00e-10 < 1e-07", ("embeddings",))
    ]
    assert watchdog.stop == first[0]
    again = watchdog.signals(signals(20, gradient_norm=[1e-9, 1e-9, 0.5]))  # embeddings again: not raised
    assert [alert.where for alert in again] == [("layer 0",)]
    assert watchdog.alerts == first + again
    assert Alert.from_json(again[0].to_json()) == again[0]


def test_divergence_comes_first_and_later_alerts_follow_it() -> None:
    # Listed last, the divergence rule is still evaluated first: one signal record with a gradient that is
    # not finite and 90 % of layer 0's activations saturated raises it, then saturation as following it.
    watchdog = Watchdog([SaturatedActivation(), VanishingGradient(), ExplodingGradient()])
    assert watchdog.train(1, 0.7) == []
    record = signals(2, gradient_norm=[0.5, math.inf, 0.5], saturation=[math.nan, 0.9, 0.2])
    first = watchdog.signals(record)
    assert [(alert.rule, alert.follows) for alert in first] == [
        ("exploding_gradient", None), ("saturated_activation", "exploding_gradient at step 2"),
    ]  # fmt: skip
    later = watchdog.signals(signals(4, gradient_norm=[1e-9, 0.5, 0.5]))
    assert [(alert.rule, alert.follows) for alert in later] == [
        ("vanishing_gradient", "exploding_gradient at step 2")
    ]
    assert str(later[0]).startswith("step 4: vanishing_gradient (after exploding_gradient at step 2): ")
    assert Alert.from_json(later[0].to_json()) == later[0]
    # Before any divergence, an alert follows nothing.
    calm = Watchdog([SaturatedActivation(), ExplodingGradient()])
    assert [alert.follows for alert in calm.signals(signals(2, saturation=[math.nan, 0.9, 0.2]))] == [None]


def test_rule_names_and_stop_on_are_checked() -> None:
    assert rule_names("default") == list(RULES) and len(RULES) == 12
    assert rule_names("none") == []
    assert rule_names("overfitting, frozen_heads,overfitting") == ["overfitting", "frozen_heads"]
    with pytest.raises(BertologyError, match="Unknown rule overfit; give default, smdebug, none or names"):
        rule_names("overfit")
    with pytest.raises(BertologyError, match="--stop-on names overfitting, which the run does not evaluate"):
        Watchdog([VanishingGradient()], stop_on=["overfitting"])
