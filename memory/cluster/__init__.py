"""Steward as a cluster: the shared state in PostgreSQL (store), the data dir kept in step
with it (mirror), and moving a data dir in and out of it (export). Imported only when
`database_url` is set: a single process never loads psycopg."""
