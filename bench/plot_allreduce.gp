# Plots of the allreduce comparison of scripts/bench.sh (treeduce against Gloo ring and
# MPI_Allreduce), from the data file it derives from allreduce-KIND.jsonl, e.g. for dpdk hosts:
#   gnuplot -e "datafile='OUT/allreduce_dpdk_f32_sum.dat'; outprefix='OUT/allreduce_dpdk_f32_sum'; \
#               label='f32 sum, 4 ranks'; gloo_big=2" bench/plot_allreduce.gp
# Writes OUTPREFIX.png (algbw and latency against message size) and OUTPREFIX_speedup.png
# (treeduce's speed-up over each baseline, with the targets). Data file: whitespace columns, '?'
# where not measured:
#   1 size (bytes)  2 treeduce time_us  3 treeduce algbw  4 gloo time_us  5 gloo algbw
#   6 gloo speedup  7 mpi time_us  8 mpi algbw  9 mpi speedup  10-12 min_us of treeduce/gloo/mpi
if (!exists("datafile")) {
  print "plot_allreduce.gp: set datafile (and outprefix, label) with -e"
  exit status 2
}
if (!exists("outprefix")) outprefix = datafile[1:strlen(datafile) - 4]
if (!exists("label")) label = ""
# The speed-up over Gloo's ring that sizes >= 1 MiB must reach (scripts/bench.sh: 2 for
# kernel-bypass hosts, 1 for hosts without DPDK).
if (!exists("gloo_big")) gloo_big = 2

set datafile missing "?"
set datafile commentschars "#"
stats datafile using 1 nooutput
xmin = STATS_min
xmax = STATS_max

# pngcairo when this gnuplot has it, else libgd's png.
if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {
  term = 'pngcairo noenhanced font "Sans,12" linewidth 1.5'
} else {
  term = 'png noenhanced font "Sans,12" linewidth 2'
}
set terminal @term size 1600,640

# x: message size, log2 axis, tics at powers of two labelled in B/KiB/MiB (every other power
# when there are many).
sizelabel(x) = x >= 1048576 ? sprintf("%g MiB", x / 1048576.0) : \
               x >= 1024 ? sprintf("%g KiB", x / 1024.0) : sprintf("%g B", x)
lo = floor(log(xmin) / log(2) + 0.5)
hi = floor(log(xmax) / log(2) + 0.5)
step = (hi - lo) > 12 ? 2 : 1
set logscale x 2
set xrange [xmin / 1.4 : xmax * 1.4]
set xtics nomirror rotate by -30
unset mxtics
set xtics ()
do for [i = lo : hi : step] {
  set xtics add (sizelabel(2**i) 2**i)
}
set xlabel "message size"
set grid xtics ytics mytics lc rgb "#dddddd" lt 1
set key top left box opaque
set border 3
set ytics nomirror

# Line styles (macros): treeduce red and thick, Gloo blue, MPI green; *c = the colour alone.
tdc = 'lc rgb "#d62728"'
glc = 'lc rgb "#1f77b4"'
mpc = 'lc rgb "#2ca02c"'
td = tdc . ' pt 7 ps 1.1 lw 2.5'
gl = glc . ' pt 5 ps 1.0 lw 1.5'
mp = mpc . ' pt 9 ps 1.2 lw 1.5'

set output outprefix . ".png"
set multiplot layout 1,2 title "Allreduce: treeduce (in-network) vs Gloo ring vs MPI_Allreduce" . \
  (label eq "" ? "" : " - " . label) font ",14"

set title "Algorithm bandwidth (size / time; higher is better)"
set ylabel "algbw (GB/s, log scale)"
set logscale y 10
set format y "%g"
plot datafile using 1:3 with linespoints @td title "treeduce", \
     '' using 1:5 with linespoints @gl title "Gloo ring", \
     '' using 1:8 with linespoints @mp title "MPI_Allreduce (Open MPI)"

set title "Latency per allreduce (lower is better; dotted: fastest iteration)"
set ylabel "time (us, log scale)"
set key top left
plot datafile using 1:2 with linespoints @td title "treeduce", \
     '' using 1:4 with linespoints @gl title "Gloo ring", \
     '' using 1:7 with linespoints @mp title "MPI_Allreduce (Open MPI)", \
     '' using 1:10 with lines @tdc dt 3 lw 1.5 notitle, \
     '' using 1:11 with lines @glc dt 3 lw 1.5 notitle, \
     '' using 1:12 with lines @mpc dt 3 lw 1.5 notitle
unset multiplot

# Speed-up: baseline time / treeduce time. Targets (4 ranks, against Gloo ring): >= gloo_big x
# algbw for sizes >= 1 MiB, <= 0.5x latency (= 2x speed-up) for sizes <= 4 KiB: shaded regions.
set terminal @term size 1000,640
set output outprefix . "_speedup.png"
set title "treeduce speed-up over the baselines (baseline time / treeduce time)" . \
  (label eq "" ? "" : " - " . label)
set ylabel "speed-up (log scale; > 1: treeduce faster)"
set logscale y 2
# y range: every speed-up measured, and at least 0.5x to 4x (the 1x line and the 2x targets).
stats datafile using (valid(6) ? column(6) : 1) nooutput
ylo = STATS_min
yhi = STATS_max
stats datafile using (valid(9) ? column(9) : 1) nooutput
ylo = ylo < STATS_min ? ylo : STATS_min
yhi = yhi > STATS_max ? yhi : STATS_max
ylo = ylo < 0.5 ? ylo / 1.2 : 0.5
yhi = yhi > 4 ? yhi * 1.2 : 4
set yrange [ylo : yhi]
set format y "%gx"
unset object
unset arrow
unset label
set style rectangle fs solid 0.12 noborder
if (xmin <= 4096) {
  set object 1 rectangle from graph 0, first 2 to first 4096 * 1.2, graph 1 fc rgb "#ff7f0e" behind
  set label 1 "target (shaded): latency\n<= 0.5x Gloo's, sizes <= 4 KiB" at graph 0.02, graph 0.95 \
    left front tc rgb "#b35900"
  set arrow 1 from graph 0, first 2 to first 4096 * 1.2, first 2 nohead lc rgb "#ff7f0e" lw 2 dt 2
}
if (xmax >= 1048576) {
  set object 2 rectangle from first 1048576 / 1.2, first gloo_big to graph 1, graph 1 \
    fc rgb "#9467bd" behind
  set label 2 sprintf("target (shaded): algbw\n>= %gx Gloo's, sizes >= 1 MiB", gloo_big) \
    at graph 0.98, graph 0.95 right front tc rgb "#5e3c99"
  set arrow 2 from first 1048576 / 1.2, first gloo_big to graph 1, first gloo_big nohead \
    lc rgb "#9467bd" lw 2 dt 2
}
set arrow 3 from graph 0, first 1 to graph 1, first 1 nohead lc rgb "#555555" lw 1
set key below
set bmargin 6
plot datafile using 1:6 with linespoints @gl title "vs Gloo ring", \
     '' using 1:9 with linespoints @mp title "vs MPI_Allreduce (Open MPI)" noenhanced
