from structlens.calibration.run import main

main()
