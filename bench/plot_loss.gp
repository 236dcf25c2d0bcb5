# Loss curves of bench/torch_loss_curves.sh: training loss per epoch with the gradients reduced in
# the network as float32, bf16, FP8 E4M3 and FP8 E5M2 (top), and each hook's loss minus float32's
# (bottom: the curves overlap at the top's scale).
#   gnuplot -e "datafile='docs/img/loss.dat'; outfile='docs/img/ddp-loss-curves.png'" bench/plot_loss.gp
# Data file: epoch, then the loss of float32, bf16, e4m3, e5m2; '?' where missing.
if (!exists("datafile")) {
  print "plot_loss.gp: set datafile (and outfile) with -e"
  exit status 2
}
if (!exists("outfile")) outfile = datafile[1:strlen(datafile) - 4] . ".png"
set datafile missing "?"
set terminal pngcairo size 900,800 font ",11" noenhanced
set output outfile
set multiplot layout 2,1 title "DDP training, 4 ranks, gradients summed in the switch (examples/ddp_train.py)"
set grid
set key top right
set xlabel "epoch (20 steps)"
set ylabel "training loss (cross-entropy)"
plot datafile using 1:2 with linespoints lw 2 title "float32", \
     datafile using 1:3 with linespoints lw 2 title "bf16 hook", \
     datafile using 1:4 with linespoints lw 2 title "FP8 E4M3 hook", \
     datafile using 1:5 with linespoints lw 2 title "FP8 E5M2 hook"
set ylabel "loss minus float32's loss"
set format y "%.1e"
plot datafile using 1:($3 - $2) with linespoints lw 2 lc 2 title "bf16 hook", \
     datafile using 1:($4 - $2) with linespoints lw 2 lc 3 title "FP8 E4M3 hook", \
     datafile using 1:($5 - $2) with linespoints lw 2 lc 4 title "FP8 E5M2 hook", \
     0 with lines lc rgb "black" notitle
unset multiplot
