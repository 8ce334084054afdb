"""Event-sourced recovery ledger on Apache Kafka."""
