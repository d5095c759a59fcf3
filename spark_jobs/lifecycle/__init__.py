"""The rule lifecycle behind the Airflow DAGs: git polling and checkout, settings,
release steps (validate, history + quality, backtest plan, report, decision) and the
audit log. Plain functions, testable without Airflow; the DAGs only wire them up."""
