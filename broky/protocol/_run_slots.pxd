# Building a Run without its attrs __init__ (see _run_slots.pyx); cimported
# by _forward.pyx, whose chunk reader builds one Run per run it reads.

from libc.stdint cimport int64_t

cdef object new_run(object key, int64_t ts_broker, int64_t count, object sizes,
                    object messages, object chunk, object partition=*,
                    object base_offset=*)
