"""Overload against a real server process: the SLA holds for the requests admitted.

One simulated replica (t(b) = 20 ms + 1 ms·b, max batch 8: about 286 rps) under open-loop
Poisson load at twice its capacity, from `batchpilot loadgen`'s own client. Without admission
nearly every request would wait behind all the others and expire (congestion collapse); with
deadline admission the ones admitted are answered inside their deadline and the rest are
refused at once with 503 + Retry-After.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import aiohttp
import orjson

from batchpilot.runtime.admission import LATENESS_WINDOW_S
from batchpilot.runtime.loadgen import LoadConfig, LoadReport, RateSchedule, Target, run_load
from batchpilot.runtime.loadgen.errors import SHED_KINDS
from tests.runtime_process import Reply, RuntimeProcess, Scrape, runtime_process, send
from tests.test_server_process import error_of, mlp_rows, v2_request

ALPHA_MS, BETA_MS, MAX_BATCH = 20.0, 1.0, 8
CAPACITY_RPS = MAX_BATCH / (ALPHA_MS + BETA_MS * MAX_BATCH) * 1e3  # 8 / 28 ms = 286 rps
DEADLINE_MS = 100.0
SIMULATED = (
    "--engine",
    "simulated",
    "--simulated-latency",
    f"alpha_ms={ALPHA_MS:g},beta_ms={BETA_MS:g}",
    "--max-batch-size",
    str(MAX_BATCH),
    "--max-queue-delay-ms",
    "2",
    "--deadline-ms",
    f"{DEADLINE_MS:g}",
)


async def twice_the_capacity(
    model: Path, log_dir: Path, *args: str, seconds: float
) -> tuple[LoadReport, Scrape]:
    """Open-loop Poisson load at twice the capacity for `seconds`; the client's report and the
    server's metrics after it."""
    with runtime_process(model, *SIMULATED, *args, log_dir=log_dir) as server:
        report = await run_load(
            LoadConfig(
                target=Target(url=server.url, model="mlp", timeout_s=5.0),
                schedule=RateSchedule.constant(2 * CAPACITY_RPS),
                duration_s=seconds,
                sla_ms=DEADLINE_MS,
                # a loaded 2-core machine: judge the client by a looser schedule, but judge it
                max_send_lag_ms=25.0,
            )
        )
        return report, Scrape(server)


def shed_by_reason(scrape: Scrape) -> dict[str, float]:
    return {
        reason: scrape.value("batchpilot_shed_total", reason=reason)
        for reason in ("predicted_late", "queue_full", "draining", "expired")
    }


class TestTwiceTheCapacity:
    async def test_admitted_requests_keep_the_deadline_and_the_rest_are_refused_at_once(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        report, scrape = await twice_the_capacity(mlp_model, tmp_path, seconds=4.0)
        assert report.valid, report.invalid_reason
        # every request answered: no client timeouts, no connection errors, no 500s; 503
        # refusals, and 504 for the few admitted requests that still missed their deadline
        assert set(report.errors) <= {*SHED_KINDS, "504"}, report.errors
        assert report.shed > 0.25 * report.scheduled, (report.shed, report.scheduled)
        # Admission predicts each finish from the measured t(b) and the queue ahead; the few that
        # still expire are batches the shared CPU slowed after admission. Queue admission expires
        # more than half (below); how few expire here (well under 1 % on a quiet machine) is a
        # performance figure, measured side by side in `make bench` (bench/overload.py), and
        # this bound only keeps the two modes apart on a busy two-core machine.
        expired = report.errors.get("504", 0)
        assert expired <= 0.05 * report.succeeded, (expired, report.succeeded)
        # the admitted: every answer inside the deadline, as the server timed it (the first
        # histogram edge 10 % past it leaves room for writing the answer). The client's own
        # view adds its lag on the same two busy cores — tens of milliseconds at P99 when the
        # machine is shared — so its P99 from the scheduled send is a `make bench` figure.
        success = scrape.value("batchpilot_requests_total", outcome="success")
        durations = dict(scrape.buckets("batchpilot_request_duration_seconds"))
        edge = min(b for b in durations if b >= 1.1 * DEADLINE_MS / 1e3)
        within = durations[edge]
        assert within >= success, (within, success, edge)
        # refusals come at once, not after waiting
        assert report.shed_latency_ms is not None
        assert report.shed_latency_ms.p99_ms < 25, report.shed_latency_ms
        # what the device can carry is served inside the SLA
        assert report.goodput_rps is not None
        assert report.goodput_rps >= 0.75 * CAPACITY_RPS, report.goodput_rps

        # the server's own account adds up
        arrivals = scrape.value("batchpilot_arrivals_total")
        admitted = scrape.value("batchpilot_admitted_total")
        shed = shed_by_reason(scrape)
        assert arrivals == admitted + shed["predicted_late"] + shed["queue_full"]
        assert shed["predicted_late"] > 0
        assert shed["draining"] == 0
        # inside the server a refusal takes well under 5 ms at P99 (the client adds its own)
        refusals = scrape.value("batchpilot_refusal_duration_seconds_count")
        assert refusals == shed["predicted_late"]
        within_5ms = scrape.value("batchpilot_refusal_duration_seconds_bucket", le="0.005")
        assert within_5ms >= 0.99 * refusals, (within_5ms, refusals)
        assert scrape.value("batchpilot_requests_total", outcome="timeout") == shed["expired"]
        assert admitted == success + shed["expired"]
        # every row computed was an answer, but for requests whose deadline passed while their
        # batch ran (a batch is never interrupted): none expired in the queue and ran anyway
        computed = scrape.value("batchpilot_batch_rows_total")
        assert success <= computed <= success + shed["expired"]
        # and the offered load is measured: every request the client sent arrived
        assert arrivals == report.sent

    async def test_queue_admission_collapses_where_deadline_admission_holds(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        """The same load with only the queue bound: what the deadline mode is there for."""
        report, scrape = await twice_the_capacity(
            mlp_model, tmp_path, "--admission", "queue", seconds=3.0
        )
        assert report.goodput_rps is not None
        assert report.goodput_rps < 0.25 * CAPACITY_RPS, report.goodput_rps
        expired = shed_by_reason(scrape)["expired"]
        assert expired > 0.5 * report.scheduled
        # and the device spent most of its time on answers whose deadline passed while they ran
        computed = scrape.value("batchpilot_batch_rows_total")
        success = scrape.value("batchpilot_requests_total", outcome="success")
        assert computed - success > 0.5 * computed, (computed, success)


class TestAFreshServersFirstBurst:
    async def test_the_requests_admitted_are_answered_inside_the_deadline(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        """A thousand 1-row requests at once on a server that has answered nothing yet (t(b) =
        8 + 1.5·b ms, batches of 8: about 20 ms each; deadline 1 s). The event loop spends
        150-400 ms reading, checking and refusing them, while the device waits for it, and no
        answer has measured that before every admission is decided. Before the margin for an
        unmeasured server (`UNMEASURED_LATENESS_SHARE`) 8-25 % of the ~390 admitted ended 504."""
        burst = 1000
        with runtime_process(
            mlp_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            "alpha_ms=8,beta_ms=1.5",
            log_dir=tmp_path,
        ) as server:
            body, headers = v2_request(mlp_rows(1, seed=0))
            url = f"{server.url}/v2/models/mlp/infer"
            connector = aiohttp.TCPConnector(limit=0)
            timeout = aiohttp.ClientTimeout(total=20)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

                async def status() -> int:
                    async with session.post(url, data=body, headers=headers) as reply:
                        await reply.read()
                        return reply.status

                statuses = Counter(await asyncio.gather(*(status() for _ in range(burst))))
            assert set(statuses) <= {200, 503}, statuses
            # the device's 1 s holds ~390 of them, the margin keeps half of that for the loop
            assert statuses[200] >= 100, statuses
            scrape = Scrape(server)
            assert shed_by_reason(scrape)["expired"] == 0
            assert scrape.value("batchpilot_admitted_total") == statuses[200]


class TestPerRequestDeadline:
    async def test_a_requests_own_timeout_is_honoured_and_a_bad_one_refused(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        with runtime_process(mlp_model, *SIMULATED, log_dir=tmp_path) as server:
            body = orjson.loads(v2_request(mlp_rows(1, seed=0))[0])
            assert send_json(server, body).status == 200  # the measurements are fresh
            # 5 ms is less than any batch (21 ms at the fastest): refused for good, as no
            # replica could serve it — a 503 would read as load to add replicas for
            body["parameters"] = {"timeout": 5_000}
            reply = send_json(server, body)
            assert reply.status == 400
            assert "shorter than any batch this server has run" in error_of(reply)
            # 60 ms is enough on an idle server
            body["parameters"] = {"timeout": 60_000}
            assert send_json(server, body).status == 200
            for bad in (0, -5, 1.5, "soon", True):
                body["parameters"] = {"timeout": bad}
                reply = send_json(server, body)
                assert reply.status == 400, bad
                assert "parameters.timeout must be a positive integer" in reply.body.decode()
            scrape = Scrape(server)
            assert shed_by_reason(scrape)["predicted_late"] == 0
            assert shed_by_reason(scrape)["expired"] == 0
            # invalid requests are not arrivals: the offered load is of valid requests
            assert scrape.value("batchpilot_arrivals_total") == 2


class TestOneRequestCannotHoldTheDevice:
    def test_a_request_no_idle_replica_could_serve_in_time_is_refused_and_the_device_stays_free(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        with runtime_process(mlp_model, *SIMULATED, log_dir=tmp_path) as server:
            # 4000 rows alone take 20 + 4000 ms: more than the 100 ms default deadline, or a
            # 1 s timeout, on any replica however idle. Refused at once, for good, with what fits
            # (before: taken as a probe and run for 4 s while every request behind it got 503).
            for parameters in (None, {"timeout": 1_000_000}):
                body, headers = v2_request(
                    mlp_rows(4000, seed=1), binary_inputs={"x"}, parameters=parameters
                )
                started = time.monotonic()
                reply = send(server, "POST", "/v2/models/mlp/infer", body, headers)
                assert reply.status == 400, reply.body
                assert time.monotonic() - started < 0.5
                message = error_of(reply)
                assert "4000 rows" in message
                assert "rows a request" in message
            # the device is free: a request right behind is answered
            one = orjson.loads(v2_request(mlp_rows(1, seed=0))[0])
            assert send_json(server, one).status == 200
            # a request over the batch limit that fits its deadline still runs alone
            sixteen = orjson.loads(v2_request(mlp_rows(16, seed=2))[0])
            assert send_json(server, sixteen).status == 200
            scrape = Scrape(server)
            assert scrape.value("batchpilot_requests_total", outcome="invalid") == 2
            # a request no replica can serve is not load: no arrival, no refusal
            assert scrape.value("batchpilot_arrivals_total") == 2
            assert shed_by_reason(scrape)["predicted_late"] == 0
            assert scrape.value("batchpilot_batch_rows_total") == 17


class TestTheLatenessMarginFollowsThePresent:
    def test_tight_deadlines_are_admitted_again_a_second_after_answers_are_on_time(
        self, mlp_model: Path, tmp_path: Path
    ) -> None:
        token_file = tmp_path / "token"
        token_file.write_text("s3cret\n")
        with runtime_process(
            mlp_model,
            "--engine",
            "simulated",
            "--simulated-latency",
            f"alpha_ms={ALPHA_MS:g},beta_ms={BETA_MS:g}",
            "--max-batch-size",
            str(MAX_BATCH),
            "--max-queue-delay-ms",
            "100",
            "--no-early-start",
            "--deadline-ms",
            "1000",
            "--admin-token-file",
            str(token_file),
            log_dir=tmp_path,
        ) as server:
            one = orjson.loads(v2_request(mlp_rows(1, seed=0))[0])
            tight = {**one, "parameters": {"timeout": 50_000}}  # 50 ms; a batch takes 21
            # Each lone request waits out the 100 ms queue delay for company that never comes
            # (no early start): every answer is 100 ms later than predicted, and the server
            # learns it.
            for _ in range(10):
                assert send_json(server, one).status == 200
            assert send_json(server, tight).status == 503  # 21 ms + 100 ms of lateness
            # The delay goes; the answers are on time again. A request every 0.1 s keeps the
            # device measured (no probes), and a tight one follows each.
            reply = send(
                server,
                "PUT",
                "/admin/batching",
                b'{"maxQueueDelayMs": 0}',
                {"Authorization": "Bearer s3cret"},
                port=server.admin_port,
            )
            assert reply.status == 200, reply.body
            changed = time.monotonic()
            statuses: list[tuple[float, int]] = []
            while (since := time.monotonic() - changed) < LATENESS_WINDOW_S + 1.5:
                assert send_json(server, one).status == 200
                statuses.append((round(since, 2), send_json(server, tight).status))
                time.sleep(0.1)
            # half a second after the late answers left the window, the lateness of the past
            # no longer refuses them (before: refused for minutes, each answer on time taking
            # 1/200 of it away); a loaded machine may still make an answer late now and then,
            # which refuses a few anew
            recent = [status for since, status in statuses if since >= LATENESS_WINDOW_S + 0.5]
            assert recent.count(200) >= 0.5 * len(recent), statuses


def send_json(server: RuntimeProcess, body: object) -> Reply:
    return send(
        server,
        "POST",
        "/v2/models/mlp/infer",
        orjson.dumps(body),
        {"Content-Type": "application/json"},
    )
