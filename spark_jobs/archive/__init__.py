"""The event archive: every record of the platform's event topics, kept in a Delta Lake
table with the fields parsed once (`table` the schema and reads, `job` the streaming
writer, `maintenance` retention and compaction)."""
