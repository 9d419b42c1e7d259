from broky.client.delivery import ConvertRuns, SettleRanges

def bind(delivery_type: type, run_type: type) -> bool: ...

convert_runs: ConvertRuns
settle_ranges: SettleRanges
