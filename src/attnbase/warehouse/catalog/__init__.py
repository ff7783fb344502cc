"""The catalog: the database's tables (schema and its migrations), the ledger of statistics
files, and the run leases.
"""
