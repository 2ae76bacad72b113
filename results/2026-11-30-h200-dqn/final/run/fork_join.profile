# stepgraph profile v1
step fork_join
device NVIDIA H200
total_ms 0.3872640047920868
stream main
stream chain[0]
stream chain[1]
stream chain[2]
stream chain[3]
op 0 0 0.0037120002089068294 seed seed
op 1 0.005536000127904117 0.37145598779898137 chain chain[0]
op 2 0.007711999933235347 0.37440001021604985 chain chain[1]
op 3 0.010304000112228096 0.3769920076010749 chain chain[2]
op 4 0.01302400033455342 0.3790079856989905 chain chain[3]
op 0 0.38048001180868596 0.3872640038607642 total total
wait 0 1
wait 0 2
wait 0 3
wait 0 4
wait 1 5
wait 2 5
wait 3 5
wait 4 5
critical 0 2 5
