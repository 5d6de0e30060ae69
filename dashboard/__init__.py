"""The Streamlit dashboard over runs.duckdb: `streamlit run dashboard/app.py -- --db runs.duckdb`."""
