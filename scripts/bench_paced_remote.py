"""The paced replay through efim to llama-server replicas on this machine, against efim in-process.

    python scripts/bench_paced_remote.py --model default --requests 40            # 2 replicas started here
    python scripts/bench_paced_remote.py --model default --requests 40 --kill     # one killed halfway
    python scripts/bench_paced_remote.py --backend http://gpu1:8080,http://gpu2:8080

See efim_local/bench/paced_remote.py.
"""

from efim_local.bench.paced_remote import main

main()
