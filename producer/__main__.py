from producer.cli import main

main()
