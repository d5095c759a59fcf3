#!/bin/bash
# One Kafka node of docker/ with SASL/SCRAM and ACLs (spark_jobs/kafka/security.py).
#
# The compose file gives the node's properties as KAFKA_* variables (KAFKA_FOO_BAR ->
# foo.bar, as the apache/kafka image reads them; tests/unit/test_docker_compose.py
# checks them against the one-machine cluster's). What is secret never sits in a
# variable or the compose file: the admin's password comes from the Docker secret
# kafka_admin_password and goes into the node's JAAS lines and, on first start, into
# the log folder's SCRAM credentials (`kafka-storage.sh format --add-scram`). The
# other principals are stored by platform-init over SASL as the admin.
set -euo pipefail
umask 077

secret=/run/secrets/kafka_admin_password
[ -s "$secret" ] || { echo "kafka_node: secret kafka_admin_password missing" >&2; exit 1; }
pw=$(cat "$secret")
conf=/tmp/kafka/server.properties
client=/tmp/kafka/admin-client.properties
mkdir -p /tmp/kafka

module='org.apache.kafka.common.security.scram.ScramLoginModule required'
{
  env | grep '^KAFKA_' | grep -v -e '^KAFKA_HEAP_OPTS=' -e '^KAFKA_OPTS=' | while IFS='=' read -r key value; do
    name=${key#KAFKA_}
    name=${name,,}
    printf '%s=%s\n' "${name//_/.}" "$value"
  done
  # Inter-broker traffic authenticates as the admin; clients on the host listener as themselves.
  printf '%s=%s username="admin" password="%s";\n' \
    "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config" "$module" "$pw"
  printf '%s=%s;\n' "listener.name.host.scram-sha-512.sasl.jaas.config" "$module"
} > "$conf"

# For the healthcheck (kafka-broker-api-versions.sh --command-config).
printf 'security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\nsasl.jaas.config=%s username="admin" password="%s";\n' \
  "$module" "$pw" > "$client"

/opt/kafka/bin/kafka-storage.sh format --ignore-formatted --cluster-id="$CLUSTER_ID" -c "$conf" \
  --add-scram "SCRAM-SHA-512=[name=admin,password=$pw]"
exec /opt/kafka/bin/kafka-server-start.sh "$conf"
