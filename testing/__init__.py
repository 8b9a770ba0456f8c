"""The test harness: local services, clusters of real servers, the chaos campaign's faults."""
