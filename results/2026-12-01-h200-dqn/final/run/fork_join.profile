# stepgraph profile v1
step fork_join
device NVIDIA H200
total_ms 0.38937600411009043
stream main
stream chain[0]
stream chain[1]
stream chain[2]
stream chain[3]
op 0 0 0.0036799998488277197 seed seed
op 1 0.005600000033155084 0.3713279974181205 chain chain[0]
op 2 0.008031999925151467 0.37462398526258767 chain chain[1]
op 3 0.011679999763146043 0.37759998557157815 chain chain[2]
op 4 0.015776000218465924 0.38080000993795693 chain chain[3]
op 0 0.38233599183149636 0.3891839992720634 total total
wait 0 1
wait 0 2
wait 0 3
wait 0 4
wait 1 5
wait 2 5
wait 3 5
wait 4 5
critical 0 2 5
