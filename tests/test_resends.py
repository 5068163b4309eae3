"""Resends: a client that sends what was just refused again, on the same connection, before the
Retry-After it was given (as many load generators do) is refused again at once, undecoded, and
counted as a retry rather than demand; a new request on that connection, or the resend once the
Retry-After has passed, is weighed as any other."""

from __future__ import annotations

import http.client
import threading
from pathlib import Path

from batchpilot.runtime.attempts import RESEND_GRACE_S, Resends
from tests.runtime_process import Reply, Scrape, metric, runtime_process, send
from tests.test_server_process import mlp_rows, v2_request
from tests.waiting import wait_until


class TestResends:
    def test_the_same_body_within_its_retry_after_is_a_resend(self) -> None:
        resends = Resends()
        resends.refused(b"body", rows=8, retry_after_s=1.0, now=10.0)
        resent = resends.resend(b"body", 10.2)
        assert resent is not None
        assert (resent.rows, resent.until) == (8, 11.0)
        assert resends.resend(b"another", 10.2) is None
        # after the Retry-After, within the grace: a retry that waited as told
        assert resends.resend(b"body", 11.5) is not None
        assert resends.resend(b"body", 11.0 + RESEND_GRACE_S + 0.1) is None

    def test_a_request_served_forgets_the_refusal(self) -> None:
        resends = Resends()
        resends.refused(b"body", rows=1, retry_after_s=1.0, now=0.0)
        resends.served()
        assert resends.resend(b"body", 0.1) is None


def post(conn: http.client.HTTPConnection, body: bytes, headers: dict[str, str]) -> Reply:
    conn.request("POST", "/v2/models/mlp/infer", body=body, headers=headers)
    response = conn.getresponse()
    return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())


def test_resends_before_the_retry_after_are_refused_undecoded_and_counted_as_retries(
    mlp_model: Path, tmp_path: Path
) -> None:
    # A batch takes 2 s and the queue holds one request: with one running and one queued, the
    # next is refused (queue full, Retry-After: 1).
    with runtime_process(
        mlp_model,
        "--engine", "simulated",
        "--simulated-latency", "alpha_ms=2000,beta_ms=0",
        "--admission", "queue",
        "--queue-capacity", "1",
        "--max-batch-size", "1",
        "--deadline-ms", "10000",
        log_dir=tmp_path,
    ) as server:  # fmt: skip
        body, headers = v2_request(mlp_rows(1, seed=0))
        background = [
            threading.Thread(
                target=send, args=(server, "POST", "/v2/models/mlp/infer", body, headers)
            )
            for _ in range(2)
        ]
        background[0].start()
        wait_until(lambda: metric(server, "batchpilot_inflight_requests") == 1, what="one runs")
        background[1].start()
        wait_until(lambda: metric(server, "batchpilot_queue_depth") == 1, what="one queued")

        mine, _ = v2_request(mlp_rows(4, seed=1))
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        try:
            refused = post(conn, mine, headers)
            assert refused.status == 503, refused.body
            assert refused.headers["retry-after"] == "1"
            for _ in range(20):  # sent again at once, on the same connection
                again = post(conn, mine, headers)
                assert again.status == 503
                assert "sent again before its Retry-After" in again.json()["error"]
                assert int(again.headers["retry-after"]) >= 1
            # another request on the connection is weighed as any other (the queue still full)
            other, _ = v2_request(mlp_rows(1, seed=2))
            weighed = post(conn, other, headers)
            assert weighed.status == 503
            assert "queue is full" in weighed.json()["error"]
        finally:
            conn.close()
        scrape = Scrape(server)
        assert scrape.value("batchpilot_shed_total", reason="resent_early") == 20
        assert scrape.value("batchpilot_arrivals_total", attempt="retry") == 20
        # the demand: the two in the background, mine and the other
        assert scrape.value("batchpilot_arrivals_total", attempt="first") == 4
        # the rows of a resend are those of the request it resends
        assert scrape.value("batchpilot_arrival_rows_total") == 2 + 4 + 1 + 20 * 4
        for thread in background:
            thread.join(timeout=10)
