from broky.client.delivery import ConvertLocated, ConvertRuns, SettleRanges

def bind(delivery_type: type, run_type: type) -> bool: ...

convert_runs: ConvertRuns
settle_ranges: SettleRanges
convert_located: ConvertLocated
