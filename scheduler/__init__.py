"""Placement of jobs on servers: the ring, bounded loads, the coordinator, leases and fencing."""
