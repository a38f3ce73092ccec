"""The disconnect storm (reliability/disconnect_storm.py), small: 30 requests abandoned at random points
(before the headers, after k SSE chunks, or read to the end, each at least once; completions and chat,
n 1 or 2), 10 at a time (the 1,000-stream figure is the script's, README "Reliability"). Afterwards no
request runs or waits, no KV block is held, and the next request is served: K11 at the scale of many
concurrent aborts rather than one at a time (test_k11_abort.py)."""

from __future__ import annotations

from reliability.disconnect_storm import run


def test_disconnect_storm_leaves_no_blocks_and_no_requests(server):
    report = run(server.url, streams=30, concurrency=10, seed=1, max_s=600, settle_s=10)
    assert report.streams == 30 and report.client_errors == 0, report.first_errors
    assert report.aborted_before_headers > 0 and report.aborted_mid_stream > 0 and report.completed > 0, report
    assert report.idle, report.after  # running 0, waiting 0, kv_cache_usage_perc 0 within 10 s
    assert report.next_request_ok
