set terminal pngcairo size 900,600
set output 'docs/RESULTS-curves.png'
set title 'Validation NLL (prefix of valid.txt[0,0.5)), mean over seeds'
set xlabel 'training tokens'
set ylabel 'nats / byte'
set grid
set key top right
plot 'docs/RESULTS-curves-continuum.dat' using 1:2 with linespoints title 'continuum', 'docs/RESULTS-curves-focal.dat' using 1:2 with linespoints title 'focal', 'docs/RESULTS-curves-softmax.dat' using 1:2 with linespoints title 'softmax'
