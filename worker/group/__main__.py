from worker.group.cli import main

main()
