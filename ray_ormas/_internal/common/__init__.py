"""What every process shares: the settings (validated on the driver, shipped to every rank), the
config schema, the report keys, the ledger's meeting protocol and the logging. Plain Python and
pydantic; imports nothing else of the package."""
