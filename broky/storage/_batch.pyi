"""Types of the compiled twins of ``broky.storage.batch.encode_runs_pure``
and ``broky.storage.batch.stored_byte_ends_pure``: their signatures."""

from broky.storage.batch import EncodeRuns, StoredByteEnds

encode_runs: EncodeRuns
stored_byte_ends: StoredByteEnds
