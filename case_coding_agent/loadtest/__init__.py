"""The case's workload: the session generator, the Mooncake trace, the replay client and the locust user."""
