"""One process's tables: the table configuration (TableSpec), the Python table over the op
library's table ops, its initializer, SSD tier, keys, files and checkpoint ops. The SDK API
(rec_sdk.core), the TFRA API (rec_sdk.dynamic_embedding) and the ranks
(rec_sdk.distribute.ranks) build on it."""
