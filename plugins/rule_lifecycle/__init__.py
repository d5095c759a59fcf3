"""Airflow parts of the rule lifecycle: hooks, operators, a sensor and the report view.

This folder sits in Airflow's plugins folder (on sys.path for DAGs, workers and the
api-server) but is listed in `.airflowignore`, so the plugin manager does not import
its modules one by one under bare names; `rule_lifecycle_plugin.py` registers the
plugin and DAGs import `rule_lifecycle.<module>` as a normal package.
"""
