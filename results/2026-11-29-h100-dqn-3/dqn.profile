# stepgraph profile v1
step dqn
device NVIDIA H100 80GB HBM3
total_ms 1.5618560202419758
stream main
stream branch[0]
stream branch[1]
stream branch[2]
stream branch[3]
stream ddqn
stream aux_iqn
stream aux_attn
stream comm
op 0 0 0.009151999838650227 begin begin
op 0 0.01056000031530857 0.11225599888712168 trunk_forward_s trunk_forward_s
op 5 0.016512000001966953 0.2995839947834611 trunk_forward_next trunk_forward_next
op 1 0.11603199783712626 0.3728319937363267 branch_forward branch_forward[0]
op 2 0.12451199535280466 0.3898239964619279 branch_forward branch_forward[1]
op 3 0.12505600694566965 0.38175999466329813 branch_forward branch_forward[2]
op 4 0.12195199821144342 0.38387199584394693 branch_forward branch_forward[3]
op 1 0.3903999859467149 0.7477439874783158 branch_forward_next branch_forward_next[0]
op 2 0.3924800092354417 0.7466240162029862 branch_forward_next branch_forward_next[1]
op 3 0.3845759863033891 0.7461760276928544 branch_forward_next branch_forward_next[2]
op 4 0.3865599865093827 0.7427519792690873 branch_forward_next branch_forward_next[3]
op 0 0.75897600594908 0.7845760220661759 double_dqn_target double_dqn_target
op 0 0.7869119876995683 0.8044160241261125 dueling_losses dueling_losses
op 1 0.8069439763203263 1.3407359952107072 branch_backward branch_backward[0]
op 2 0.8173120254650712 1.332768046297133 branch_backward branch_backward[1]
op 3 0.8097599977627397 1.3309440249577165 branch_backward branch_backward[2]
op 4 0.812639974988997 1.3300480479374528 branch_backward branch_backward[3]
op 8 1.3475839728489518 1.350687944330275 reduce_branches reduce_branches
op 0 0.8142079943791032 1.230208002962172 iql_high iql_high
op 0 1.2327040070667863 1.3049920434132218 iql_low iql_low
op 8 1.3570880526676774 1.3620479935780168 reduce_iql reduce_iql
op 6 0.7904319996014237 1.2208959693089128 iqn_head iqn_head
op 8 1.3646080130711198 1.3669759863987565 reduce_iqn reduce_iqn
op 7 0.11388799641281366 0.7984640235081315 attention_head attention_head
op 8 1.3691520327702165 1.3716159695759416 reduce_attention reduce_attention
op 0 1.3616959685459733 1.5281600588932633 trunk_backward trunk_backward
op 8 1.5306880110874772 1.5324799651280046 reduce_trunk reduce_trunk
op 0 1.5340159768238664 1.5622080201283097 clip_and_adam clip_and_adam
wait 1 3
wait 1 4
wait 1 5
wait 1 6
wait 2 7
wait 2 8
wait 2 9
wait 2 10
wait 7 11
wait 8 11
wait 9 11
wait 10 11
wait 12 13
wait 12 14
wait 12 15
wait 12 16
wait 13 17
wait 14 17
wait 15 17
wait 16 17
wait 19 20
wait 11 21
wait 21 22
wait 23 24
wait 13 25
wait 14 25
wait 15 25
wait 16 25
wait 21 25
wait 25 26
wait 26 27
critical 0 1 4 8 11 12 13 25 26 27
