# stepgraph profile v1
step dqn
device NVIDIA H200
total_ms 1.2916480265557766
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
op 0 0 0.005887999664992094 begin begin
op 0 0.007967999670654535 0.11999999871477485 trunk_forward_s trunk_forward_s
op 5 0.009823999833315611 0.3489599912427366 trunk_forward_next trunk_forward_next
op 1 0.12288000574335456 0.31584001472219825 branch_forward branch_forward[0]
op 2 0.132831999566406 0.32863999297842383 branch_forward branch_forward[1]
op 3 0.13113599410280585 0.3263680129311979 branch_forward branch_forward[2]
op 4 0.13318399479612708 0.3189759938977659 branch_forward branch_forward[3]
op 1 0.3526719897054136 0.5523199825547636 branch_forward_next branch_forward_next[0]
op 2 0.36179200699552894 0.5571520118974149 branch_forward_next branch_forward_next[1]
op 3 0.3570560007356107 0.5553599982522428 branch_forward_next branch_forward_next[2]
op 4 0.3562879948876798 0.5599360256455839 branch_forward_next branch_forward_next[3]
op 0 0.5715520172379911 0.5985280065797269 double_dqn_target double_dqn_target
op 0 0.6013759761117399 0.6289599924348295 dueling_losses dueling_losses
op 1 0.6314559965394437 1.1308480291627347 branch_backward branch_backward[0]
op 2 0.6389760165475309 1.121664026286453 branch_backward branch_backward[1]
op 3 0.6381760030053556 1.1184639721177518 branch_backward branch_backward[2]
op 4 0.6411840110085905 1.1251519708894193 branch_backward branch_backward[3]
op 9 1.1360000162385404 1.1383360414765775 reduce_branches reduce_branches
op 0 0.6362560181878507 1.063744047190994 iql_high iql_high
op 0 1.0662400512956083 1.1074880152009428 iql_low iql_low
op 9 1.1409280090592802 1.1433599977754056 reduce_iql reduce_iql
op 6 0.6052480130456388 1.0591360121034086 iqn_head iqn_head
op 9 1.145632007624954 1.148095944430679 reduce_iqn reduce_iqn
op 7 0.06291200360283256 0.47875199606642127 attention_head attention_head
op 8 0.4813760011456907 1.1568640260957181 attention_wgrad attention_wgrad
op 9 1.161311963107437 1.1637120037339628 reduce_attention reduce_attention
op 0 1.1497599869035184 1.2658240585587919 trunk_backward trunk_backward
op 9 1.2683839588426054 1.2703039436601102 reduce_trunk reduce_trunk
op 0 1.2717760591767728 1.2911360054276884 clip_and_adam clip_and_adam
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
critical 2 10 11 12 13 26 27 28
