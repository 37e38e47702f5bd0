"""The Scale-out page in AppTest on recorded real runs played into a real Redis."""

import json

from recorded import trio


def _titles(at) -> list[str]:
    return [json.loads(c.proto.spec)["title"]["text"] for c in at.get("vega_lite_chart")]


def test_scaleout_page_draws_predictions_on_recorded_runs(real_client, app_test):
    _, ids = trio(real_client)
    at = app_test("views/scaleout.py")
    assert not at.exception, [e.value for e in at.exception]
    print(_titles(at))
    print([e.value for e in at.error], [e.value for e in at.info], [e.value for e in at.warning])
    print([m.value for m in at.markdown])
