"""The revisions: one line per store (ledger_NNNN, conversations_NNNN). A package so that the wheel ships them."""
