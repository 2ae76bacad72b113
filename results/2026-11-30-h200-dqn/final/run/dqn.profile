# stepgraph profile v1
step dqn
device NVIDIA H200
total_ms 1.3656959631480277
stream main
stream branch[0]
stream branch[1]
stream branch[2]
stream branch[3]
stream ddqn
stream aux_iqn
stream aux_attn
stream attn_wgrad
stream comm
op 0 0 0.005856000352650881 begin begin
op 0 0.0076800002716481686 0.12121600052341819 trunk_forward_s trunk_forward_s
op 5 0.009504000190645456 0.3289600103162229 trunk_forward_next trunk_forward_next
op 1 0.12444799533113837 0.32723201205953956 branch_forward branch_forward[0]
op 2 0.1336640059016645 0.3662079959176481 branch_forward branch_forward[1]
op 3 0.13119999459013343 0.34451199462637305 branch_forward branch_forward[2]
op 4 0.13199999323114753 0.3515519886277616 branch_forward branch_forward[3]
op 1 0.3512640087865293 0.5829760222695768 branch_forward_next branch_forward_next[0]
op 2 0.36972800781950355 0.5859200148843229 branch_forward_next branch_forward_next[1]
op 3 0.3475200026296079 0.5841920166276395 branch_forward_next branch_forward_next[2]
op 4 0.354175993707031 0.5848639993928373 branch_forward_next branch_forward_next[3]
op 0 0.5970240025781095 0.6290240078233182 double_dqn_target double_dqn_target
op 0 0.6314880042336881 0.6595840244553983 dueling_losses dueling_losses
op 1 0.6617280035279691 1.2009279518388212 branch_backward branch_backward[0]
op 2 0.6715519814752042 1.2007039575837553 branch_backward branch_backward[1]
op 3 0.6700160293839872 1.2024960308335721 branch_backward branch_backward[2]
op 4 0.6679360060952604 1.1994559555314481 branch_backward branch_backward[3]
op 9 1.213759997393936 1.21571204951033 reduce_branches reduce_branches
op 0 0.6658559828065336 1.0990719585679471 iql_high iql_high
op 0 1.1019199877046049 1.1724480181001127 iql_low iql_low
op 9 1.2182400017045438 1.221824028994888 reduce_iql reduce_iql
op 6 0.6341439872048795 1.0792959718964994 iqn_head iqn_head
op 9 1.2242879658006132 1.2263680486939847 reduce_iqn reduce_iqn
op 7 0.06425599893555045 0.4919360070489347 attention_head attention_head
op 8 0.4951039939187467 1.1814080267213285 attention_wgrad attention_wgrad
op 9 1.2284799604676664 1.2309119491837919 reduce_attention reduce_attention
op 0 1.2227519541047513 1.3407679586671293 trunk_backward trunk_backward
op 9 1.3433279781602323 1.3452160148881376 reduce_trunk reduce_trunk
op 0 1.3468160419724882 1.3658239631913602 clip_and_adam clip_and_adam
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
wait 24 25
wait 13 26
wait 14 26
wait 15 26
wait 16 26
wait 21 26
wait 26 27
wait 27 28
critical 0 1 6 10 11 12 13 26 27 28
