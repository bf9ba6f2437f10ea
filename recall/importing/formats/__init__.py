"""One module per export format (docs/import.md); `recall.importing.registry` names them."""
