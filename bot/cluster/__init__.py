"""Steward as a cluster: gateways hold the platform connections, workers run the tasks.

Why a separate package: the default single process (`steward run`) must not import
any of this (nor nats-py); only `steward run --role gateway|worker` does. The
transport is NATS JetStream (events in, outbound calls back out, see `nats.py`); the
shared state is PostgreSQL (memory/cluster/). docs/cluster.md describes a deploy.
"""
