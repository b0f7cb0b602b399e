from kernelexec.cli import main

main()
