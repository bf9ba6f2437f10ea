#!/bin/sh
# The first start of an empty data volume (compose.yaml's "replicas" profile): the postgres image
# runs this once, as its superuser, before it takes connections. It makes what a superuser must
# (docs/replicas.md, "In order"): the tables' owner and the app role, each with the
# password from the container's environment (compose.yaml requires both; none is written here),
# the database owned by the owner, and pgvector in it (not a trusted extension: the owner could
# not create it). `recall-server migrate`, as recall_owner, makes the tables and grants
# recall_app what the server needs.
set -eu
psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --dbname postgres <<'SQL'
\getenv owner_password RECALL_OWNER_PASSWORD
\getenv app_password RECALL_APP_PASSWORD
CREATE ROLE recall_owner LOGIN PASSWORD :'owner_password';
CREATE ROLE recall_app LOGIN PASSWORD :'app_password';
CREATE DATABASE recall OWNER recall_owner;
\connect recall
CREATE EXTENSION vector;
SQL
