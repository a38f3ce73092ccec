"""Shards, the shard worker and the night report (standard library only: Airflow imports them)."""
