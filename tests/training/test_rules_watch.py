"""The training rules' alerts on the watch page: in its data, marked on the figures, and in real Chromium
a list whose entries move the step slider to the alert and show the heads it names."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from support.browser import open_view
from support.run_folders import CHANGED, STEPS, write_synthetic_run

from bertology.training.rules import Alert
from bertology.training.watch import watch_data, watch_html

HEAD_ALERT = Alert("frozen_heads", 4, "layer 0 head 1: attention unchanged", ("layer 0 head 1",), (CHANGED,))
LOSS_ALERT = Alert("exploding_gradient", 10, "training loss 900, from 0.7", ("training loss",))


def run_with_alerts(folder: Path, alerts: list[Alert]) -> Path:
    run = write_synthetic_run(folder)
    info = json.loads((run / "run.json").read_text())
    info["alerts"] = [alert.to_json() for alert in alerts]
    (run / "run.json").write_text(json.dumps(info))
    return run


def figures(data: dict[str, Any]) -> list[bytes]:
    return [base64.b64decode(f["png"]) for section in data["sections"] for f in section.get("figures", [])]


def test_alerts_are_in_the_data_and_marked_on_the_figures(tmp_path: Path) -> None:
    marked = watch_data(run_with_alerts(tmp_path / "marked", [HEAD_ALERT, LOSS_ALERT]))
    plain = watch_data(run_with_alerts(tmp_path / "plain", []))
    assert [alert["rule"] for alert in marked["alerts"]] == ["frozen_heads", "exploding_gradient"]
    assert [alert["record"] for alert in marked["alerts"]] == [1, 2]  # steps 0, 5, 10: step 4 shows at 5
    assert marked["alerts"][0]["heads"] == [list(CHANGED)]
    assert plain["alerts"] == []
    # The curves, the statistic figures and the change heatmap carry marks; the statistic deltas do not.
    pairs = list(zip(figures(marked), figures(plain), strict=True))
    assert all(a != b for a, b in pairs[:-1]) and pairs[-1][0] == pairs[-1][1]


def test_alerts_on_one_step_share_a_numbered_mark_listed_in_the_caption(tmp_path: Path) -> None:
    same_step = Alert(
        "saturated_activation", 10, "head: 100 %", ("head",), follows="exploding_gradient at step 10"
    )
    data = watch_data(run_with_alerts(tmp_path / "run", [HEAD_ALERT, LOSS_ALERT, same_step]))
    caption = data["sections"][0]["figures"][0]["caption"]
    assert caption == (
        "Dashed: the training rules' alerts (1: step 4, frozen_heads; "
        "2: step 10, exploding_gradient, saturated_activation)."
    )
    assert data["alerts"][2]["follows"] == "exploding_gradient at step 10"


def test_damaged_alerts_are_named(tmp_path: Path) -> None:
    from bertology.errors import BertologyError

    run = write_synthetic_run(tmp_path / "run")
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(info | {"alerts": [{"rule": "x"}]}))
    with pytest.raises(BertologyError, match=r"alerts in .*run\.json cannot be read"):
        watch_data(run)


@pytest.mark.browser
def test_an_alert_moves_to_its_step_and_shows_its_heads(chromium_browser: Any, tmp_path: Path) -> None:
    run = run_with_alerts(tmp_path / "run", [HEAD_ALERT, LOSS_ALERT])
    page_file = run / "watch.html"
    page_file.write_text(watch_html(run), encoding="utf-8")
    context = chromium_browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        view = open_view(context, page_file)
        buttons = view.page.locator("#bt-alerts .bt-alert")
        assert buttons.count() == 2
        assert view.js("document.querySelector('#bt-alerts h2').textContent") == "Alerts (2)"
        first = buttons.nth(0)
        assert first.get_attribute("data-rule") == "frozen_heads" and first.get_attribute("data-step") == "4"
        assert "layer 0 head 1" in first.text_content()
        assert view.state()["watch"]["stepIndex"] == len(STEPS) - 1
        first.click()
        state = view.state()
        assert state["watch"]["step"] == 5 and state["watch"]["mode"] == "head"
        assert state["layer"] == CHANGED[0] and state["heads"] == [CHANGED[1]]
        buttons.nth(1).click()  # no heads named: only the step moves
        assert view.state()["watch"]["step"] == 10 and view.state()["heads"] == [CHANGED[1]]
        view.assert_clean()
    finally:
        context.close()
