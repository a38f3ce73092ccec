"""The disconnect storm (reliability/disconnect_storm.py), small: 60 requests abandoned at random points
(before the headers, after k SSE chunks, or read to the end; completions and chat, n 1 or 2), 16 at a
time. Afterwards no request runs or waits, no KV block is held, and the next request is served: K11 at
the scale of many concurrent aborts rather than one at a time (test_k11_abort.py)."""

from __future__ import annotations

from reliability.disconnect_storm import run


def test_disconnect_storm_leaves_no_blocks_and_no_requests(server):
    report = run(server.url, streams=60, concurrency=16, seed=1, max_s=600, settle_s=10)
    assert report.streams == 60 and report.client_errors == 0, report.first_errors
    assert report.aborted_before_headers > 0 and report.aborted_mid_stream > 0 and report.completed > 0, report
    assert report.idle, report.after  # running 0, waiting 0, kv_cache_usage_perc 0 within 10 s
    assert report.next_request_ok
