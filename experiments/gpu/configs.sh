# The GPU benchmark configurations: model -> "batch [--dim ...]", and the ratios swept.
# Budgets of 50%, 33% and 25% of the unconstrained peak (1:1, 1:2, 1:3); VGG19's largest
# kernel needs 61% of its peak (a plan cannot exist below), so it also runs at 2:1, 3:1 and 4:1
# (67%, 75%, 80%).
declare -A CFG=(
  [inception_v4]="64" [resnet200]="32" [densenet264]="32" [vgg19]="64"
  [bert_base]="16 --dim seq=512" [gpt2_small]="8 --dim seq=1024"
)
declare -A RATIOS=([vgg19]="4:1,3:1,2:1,1:1,1:2,1:3")
MODELS=(inception_v4 resnet200 densenet264 vgg19 bert_base gpt2_small)
ratios_of() { echo "${RATIOS[$1]:-1:1,1:2,1:3}"; }
