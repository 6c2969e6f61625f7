"""The dashboard offers the CLI's HTML report: a download button under a page's view and in History."""


def _report_buttons(at):
    return [b for b in at.get("download_button") if "Download report (HTML)" in str(b.proto.label)]


def test_model_page_and_history_offer_the_html_report(new_app):
    at = new_app().run()
    assert not at.exception, [e.value for e in at.exception]
    buttons = _report_buttons(at)
    assert len(buttons) == 1
    assert "report-summary-" in buttons[0].proto.id  # keyed per analysis + result
    at.switch_page("pages/history.py").run()
    assert not at.exception, [e.value for e in at.exception]
    # History opens the newest run of the (shared) test store: open this summary run, whatever ran before
    pick = at.selectbox(key="history_pick")
    mine = next(i for i, o in enumerate(pick.options) if " · summary · " in o and " · ok · " in o)
    pick.select_index(mine).run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(_report_buttons(at)) == 1

